#include "common/file_semaphore.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/posix_error.h"

namespace tierd {
namespace {

// Locks byte `slot` of `fd`, waiting for it with `wait`. OK, or the error (EAGAIN: held).
int LockByte(int fd, int slot, bool wait) {
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = slot;
  lock.l_len = 1;
  while (::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &lock) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileSemaphore>> FileSemaphore::Open(const std::string& path,
                                                                   int count) {
  if (count < 1) return absl::InvalidArgumentError("a semaphore needs at least one slot");
  ScopedFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path), errno);
  struct stat status = {};
  if (::fstat(fd.get(), &status) != 0) return PosixError(absl::StrCat("stat ", path), errno);
  if (!S_ISREG(status.st_mode) || status.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, " must be a regular file of this user's (uid ", ::geteuid(), ")"));
  }
  return std::unique_ptr<FileSemaphore>(new FileSemaphore(path, count));
}

absl::StatusOr<FileSemaphore::Slot> FileSemaphore::Acquire() {
  ScopedFd fd(::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path_), errno);
  const uint32_t first = next_.fetch_add(1);
  for (int i = 0; i < count_; ++i) {
    const int error = LockByte(fd.get(), static_cast<int>((first + i) % count_), /*wait=*/false);
    if (error == 0) return Slot(std::move(fd));
    if (error != EAGAIN && error != EACCES) {
      return PosixError(absl::StrCat("locking ", path_), error);
    }
  }
  // All held: wait for one (a holder's GET is short; its neighbours may free sooner, but this
  // one will free).
  const int error = LockByte(fd.get(), static_cast<int>(first % count_), /*wait=*/true);
  if (error != 0) return PosixError(absl::StrCat("locking ", path_), error);
  return Slot(std::move(fd));
}

}  // namespace tierd
