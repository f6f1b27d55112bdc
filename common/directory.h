// Listing a directory, with errors as Status.
#ifndef TIERD_COMMON_DIRECTORY_H_
#define TIERD_COMMON_DIRECTORY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tierd {

// The names of the entries in `dir` except "." and "..", sorted. Errors from opendir/readdir.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir);

}  // namespace tierd

#endif  // TIERD_COMMON_DIRECTORY_H_
