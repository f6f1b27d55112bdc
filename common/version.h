// tierd's version: the CMake project's (CMakeLists.txt), the one place it is written. The daemon,
// tierctl (--version), GetStats, the metrics (tierd_build_info), the Python package and the Debian
// package all report it.
#ifndef TIERD_COMMON_VERSION_H_
#define TIERD_COMMON_VERSION_H_

#include "absl/strings/string_view.h"

namespace tierd {

// "MAJOR.MINOR.PATCH", e.g. "0.1.0".
absl::string_view Version();

}  // namespace tierd

#endif  // TIERD_COMMON_VERSION_H_
