// Where models may be registered from (tierd --model-roots): a model directory, its index and
// every file read from it must resolve, symlinks followed, to a path inside one of the roots, so a
// client with access to the socket cannot make the daemon read files elsewhere on the machine.
#ifndef TIERD_STORAGE_MODEL_ROOTS_H_
#define TIERD_STORAGE_MODEL_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tierd {

class ModelRoots {
 public:
  // No roots: models may come from anywhere (still absolute paths without "..").
  ModelRoots() = default;
  // Each root must be an existing directory; they are resolved once, here.
  // Errors: INVALID_ARGUMENT naming --model-roots for a relative path or one that is not a
  // directory.
  static absl::StatusOr<ModelRoots> Create(const std::vector<std::string>& roots);

  bool confined() const { return !roots_.empty(); }
  const std::vector<std::string>& roots() const { return roots_; }  // resolved

  // OK when `path` may be read. INVALID_ARGUMENT for a relative path or one with a ".."
  // component; PERMISSION_DENIED when it resolves outside every root (naming where it resolves);
  // NOT_FOUND and other errors of resolving it when confined.
  absl::Status Check(const std::string& path) const;

 private:
  std::vector<std::string> roots_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_ROOTS_H_
