#include "storage/model_roots.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/posix_error.h"

namespace tierd {
namespace {

absl::StatusOr<std::string> Resolve(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return PosixError(absl::StrCat("resolving ", path), errno);
  }
  return std::string(resolved);
}

bool HasDotDot(const std::string& path) {
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<ModelRoots> ModelRoots::Create(const std::vector<std::string>& roots) {
  ModelRoots result;
  for (const std::string& root : roots) {
    if (root.empty() || root.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--model-roots: \"", root, "\" is not an absolute path"));
    }
    absl::StatusOr<std::string> resolved = Resolve(root);
    struct stat st;
    if (!resolved.ok() || ::stat(resolved->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model-roots: \"", root, "\" is not a directory"));
    }
    result.roots_.push_back(*std::move(resolved));
  }
  return result;
}

absl::Status ModelRoots::Check(const std::string& path) const {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("\"", path, "\" is not an absolute path"));
  }
  if (HasDotDot(path)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", path, "\" has a \"..\" component"));
  }
  if (!confined()) return absl::OkStatus();
  absl::StatusOr<std::string> resolved = Resolve(path);
  if (!resolved.ok()) return resolved.status();
  for (const std::string& root : roots_) {
    if (*resolved == root ||
        (resolved->size() > root.size() && resolved->compare(0, root.size(), root) == 0 &&
         ((*resolved)[root.size()] == '/' || root == "/"))) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      path, (*resolved == path ? "" : absl::StrCat(" (which resolves to ", *resolved, ")")),
      " is outside --model-roots (", absl::StrJoin(roots_, ", "), ")"));
}

}  // namespace tierd
