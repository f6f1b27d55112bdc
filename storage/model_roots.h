// Where models may be registered from (tierd --model-roots): a model directory, its index and
// every file read from it must resolve, symlinks followed, to a path inside one of the roots, so a
// client with access to the socket cannot make the daemon read files elsewhere on the machine.
//
// Registration records each model file by its resolved path. Every later open of it goes through
// OpenBeneath, which follows no symbolic link and cannot leave the root, so a file replaced by a
// link after registration is refused rather than followed.
#ifndef TIERD_STORAGE_MODEL_ROOTS_H_
#define TIERD_STORAGE_MODEL_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/fd_io.h"
#include "remote/s3_location.h"

namespace tierd {

class ModelRoots {
 public:
  // No roots: models may come from anywhere (still absolute paths without "..").
  ModelRoots() = default;
  // Each root must be an existing directory, resolved once here, or an s3:// bucket or prefix
  // (s3://BUCKET/PREFIX/) that remote models may be registered from. Errors: INVALID_ARGUMENT
  // naming --model-roots for a relative path, one that is not a directory, or a bad s3:// URL.
  static absl::StatusOr<ModelRoots> Create(const std::vector<std::string>& roots);

  bool confined() const { return !roots_.empty() || !remote_roots_.empty(); }
  const std::vector<std::string>& roots() const { return roots_; }  // resolved
  const std::vector<S3Url>& remote_roots() const { return remote_roots_; }

  // OK when the remote location `url` may be read: anywhere when not confined, else under one of
  // the s3:// roots (on a "/" boundary). PERMISSION_DENIED otherwise.
  absl::Status CheckRemote(const S3Url& url) const;

  // OK when `path` may be read. INVALID_ARGUMENT for a relative path or one with a ".."
  // component; PERMISSION_DENIED when it resolves outside every root (naming where it resolves);
  // NOT_FOUND and other errors of resolving it when confined. An s3:// path: CheckRemote.
  absl::Status Check(const std::string& path) const;
  // Check, then the path with every symbolic link resolved: what registration records.
  absl::StatusOr<std::string> Resolve(const std::string& path) const;

  // Opens `path`, a resolved path inside a root (anywhere when not confined), with `flags`
  // (O_CLOEXEC is added) beneath that root, following no symbolic link: a path that names a link,
  // or passes through one, is refused. Never blocks on a FIFO or a device (opened O_NONBLOCK,
  // which is cleared again unless `flags` has it): the caller checks that it is a regular file.
  // Errors: PERMISSION_DENIED for a link or a path outside every root; otherwise the open's
  // (NOT_FOUND, ...). Thread-safe.
  absl::StatusOr<ScopedFd> OpenBeneath(const std::string& path, int flags) const;

 private:
  // The root `path` lies in ("/" when not confined); empty when none.
  std::string RootOf(const std::string& path) const;

  std::vector<std::string> roots_;
  std::vector<S3Url> remote_roots_;  // keys empty or ending in "/"
};

// How OpenWithoutSymlinks resolves: kAuto uses openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
// where the kernel has it and walks otherwise; kWalk always walks the path one component at a time
// with O_NOFOLLOW (for kernels before 5.6, and for tests of that path).
enum class SymlinkFreeOpen { kAuto, kWalk };

// Opens `relative` (components separated by '/'; no "..") beneath the directory `dir_fd` with
// `flags`, following no symbolic link. `label` names the file in errors. Errors: PERMISSION_DENIED
// when a component is a symbolic link or is ".."; the open's errors otherwise.
absl::StatusOr<ScopedFd> OpenWithoutSymlinks(int dir_fd, absl::string_view relative, int flags,
                                             absl::string_view label,
                                             SymlinkFreeOpen how = SymlinkFreeOpen::kAuto);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_ROOTS_H_
