#include "common/directory.h"

#include <dirent.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/posix_error.h"

namespace tierd {

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* stream = ::opendir(dir.c_str());
  if (stream == nullptr) return PosixError(absl::StrCat("opening ", dir), errno);
  std::vector<std::string> names;
  int error = 0;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(stream);
    if (entry == nullptr) {
      error = errno;
      break;
    }
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(stream);
  if (error != 0) return PosixError(absl::StrCat("reading ", dir), error);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tierd
