#include "storage/model_roots.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/posix_error.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "storage/model_location.h"

namespace tierd {
namespace {

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return PosixError(absl::StrCat("resolving ", Quote(path)), errno);
  }
  return std::string(resolved);
}

bool HasDotDot(const std::string& path) {
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return true;
  }
  return false;
}

absl::Status LinkRefused(absl::string_view label) {
  return absl::PermissionDeniedError(
      absl::StrCat(label,
                   " passes through a symbolic link: model files are opened without "
                   "following links, and this one was not there when it was registered"));
}

// openat2 is missing before Linux 5.6, and seccomp filters may refuse it: remembered, so the
// walk is used at once from then on.
std::atomic<bool> openat2_unavailable{false};

// -1 with errno set, as open(2); ENOSYS when the kernel (or a filter) lacks openat2.
int OpenAt2(int dir_fd, const std::string& relative, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    const long fd = ::syscall(SYS_openat2, dir_fd, relative.c_str(), &how, sizeof(how));
    if (fd >= 0 || errno != EINTR) return static_cast<int>(fd);
  }
}

// Whether `name` in `dir_fd` is a symbolic link (after an open with O_NOFOLLOW failed).
bool IsSymlinkAt(int dir_fd, const std::string& name) {
  struct stat st {};
  return ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

absl::StatusOr<ScopedFd> Walk(int dir_fd, const std::vector<std::string>& parts, int flags,
                              absl::string_view label) {
  ScopedFd current(-1);
  int at = dir_fd;
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool last = i + 1 == parts.size();
    const int part_flags =
        last ? flags | O_NOFOLLOW | O_CLOEXEC : O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd;
    do {
      fd = ::openat(at, parts[i].c_str(), part_flags);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int error = errno;
      // O_NOFOLLOW refuses a link as ELOOP (the last component) or ENOTDIR (O_DIRECTORY).
      if ((error == ELOOP || error == ENOTDIR) && IsSymlinkAt(at, parts[i])) {
        return LinkRefused(label);
      }
      return PosixError(absl::StrCat("opening ", label), error);
    }
    current = ScopedFd(fd);
    at = current.get();
  }
  return current;
}

}  // namespace

absl::StatusOr<ScopedFd> OpenWithoutSymlinks(int dir_fd, absl::string_view relative, int flags,
                                             absl::string_view label, SymlinkFreeOpen how) {
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(relative, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      return absl::PermissionDeniedError(absl::StrCat(label, " has a \"..\" component"));
    }
    parts.emplace_back(part);
  }
  if (parts.empty()) return absl::InvalidArgumentError(absl::StrCat(label, " names no file"));
  if (how == SymlinkFreeOpen::kAuto && !openat2_unavailable.load(std::memory_order_relaxed)) {
    const int fd = OpenAt2(dir_fd, absl::StrJoin(parts, "/"), flags | O_CLOEXEC);
    if (fd >= 0) return ScopedFd(fd);
    const int error = errno;
    // ELOOP: a link on the way (RESOLVE_NO_SYMLINKS); EXDEV: the path would leave dir_fd.
    if (error == ELOOP || error == EXDEV) return LinkRefused(label);
    if (error != ENOSYS && error != EPERM) {
      return PosixError(absl::StrCat("opening ", label), error);
    }
    openat2_unavailable.store(true, std::memory_order_relaxed);
  }
  return Walk(dir_fd, parts, flags, label);
}

absl::StatusOr<ModelRoots> ModelRoots::Create(const std::vector<std::string>& roots) {
  ModelRoots result;
  for (const std::string& root : roots) {
    absl::StatusOr<ModelLocation> location = ParseModelLocation(root);
    if (!location.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model-roots: ", location.status().message()));
    }
    if (location->in_object_store()) {
      S3Url url = std::move(location->object);
      if (!url.key.empty() && url.key.back() != '/') url.key.push_back('/');
      result.remote_roots_.push_back(std::move(url));
      continue;
    }
    if (root.empty() || root.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--model-roots: ", Quote(root), " is not an absolute path"));
    }
    absl::StatusOr<std::string> resolved = RealPath(root);
    struct stat st;
    if (!resolved.ok() || ::stat(resolved->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model-roots: ", Quote(root), " is not a directory"));
    }
    result.roots_.push_back(*std::move(resolved));
  }
  return result;
}

std::string ModelRoots::RootOf(const std::string& path) const {
  if (!confined()) return "/";
  for (const std::string& root : roots_) {
    if (path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                         (path[root.size()] == '/' || root == "/"))) {
      return root;
    }
  }
  return "";
}

absl::StatusOr<std::string> ModelRoots::Resolve(const std::string& path) const {
  if (path.empty() || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(Quote(path), " is not an absolute path"));
  }
  if (HasDotDot(path)) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(path), " has a \"..\" component"));
  }
  absl::StatusOr<std::string> resolved = RealPath(path);
  if (!resolved.ok()) return resolved.status();
  if (RootOf(*resolved).empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        Quote(path),
        (*resolved == path ? "" : absl::StrCat(" (which resolves to ", Quote(*resolved), ")")),
        " is outside --model-roots (", absl::StrJoin(roots_, ", "), ")"));
  }
  return resolved;
}

absl::Status ModelRoots::CheckRemote(const S3Url& url) const {
  if (!confined()) return absl::OkStatus();
  for (const S3Url& root : remote_roots_) {
    if (url.bucket == root.bucket && absl::StartsWith(absl::StrCat(url.key, "/"), root.key)) {
      return absl::OkStatus();
    }
  }
  std::vector<std::string> allowed;
  for (const S3Url& root : remote_roots_) allowed.push_back(root.ToString());
  return absl::PermissionDeniedError(
      absl::StrCat(url.ToString(), " is outside --model-roots",
                   allowed.empty() ? " (no s3:// root is allowed)"
                                   : absl::StrCat(" (", absl::StrJoin(allowed, ", "), ")")));
}

absl::Status ModelRoots::Check(const std::string& path) const {
  ASSIGN_OR_RETURN(const ModelLocation location, ParseModelLocation(path));
  if (location.in_object_store()) return CheckRemote(location.object);
  if (!confined()) {
    // Unconfined, a path need not exist yet to pass; only its form is checked.
    if (path.empty() || path.front() != '/') {
      return absl::InvalidArgumentError(absl::StrCat(Quote(path), " is not an absolute path"));
    }
    if (HasDotDot(path)) {
      return absl::InvalidArgumentError(absl::StrCat(Quote(path), " has a \"..\" component"));
    }
    return absl::OkStatus();
  }
  return Resolve(path).status();
}

absl::StatusOr<ScopedFd> ModelRoots::OpenBeneath(const std::string& path, int flags) const {
  const std::string root = path.empty() || path.front() != '/' ? "" : RootOf(path);
  if (root.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(Quote(path), " is outside --model-roots (", absl::StrJoin(roots_, ", "), ")"));
  }
  ScopedFd root_fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (root_fd.get() < 0) return PosixError(absl::StrCat("opening ", Quote(root)), errno);
  const absl::string_view relative = absl::string_view(path).substr(root == "/" ? 1 : root.size());
  // Without blocking: a FIFO put where a model file was would otherwise hold the opening thread
  // (a reader, or the one that registers models) for ever. Callers refuse what is not a regular
  // file; blocking reads come back for the rest.
  ASSIGN_OR_RETURN(ScopedFd fd,
                   OpenWithoutSymlinks(root_fd.get(), relative, flags | O_NONBLOCK, Quote(path)));
  if ((flags & O_NONBLOCK) == 0) {
    const int current = ::fcntl(fd.get(), F_GETFL);
    if (current < 0 || ::fcntl(fd.get(), F_SETFL, current & ~O_NONBLOCK) != 0) {
      return PosixError(absl::StrCat("opening ", Quote(path)), errno);
    }
  }
  return fd;
}

}  // namespace tierd
