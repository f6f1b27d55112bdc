#include "common/file_semaphore.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_lock.h"
#include "common/posix_error.h"
#include "common/status_macros.h"

namespace tierd {

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

absl::StatusOr<FileSemaphore::Slot> FileSemaphore::Acquire(absl::Time deadline,
                                                           absl::FunctionRef<bool()> stopped) {
  ScopedFd fd(::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path_), errno);
  const uint32_t first = next_.fetch_add(1);
  for (int i = 0; i < count_; ++i) {
    ASSIGN_OR_RETURN(const bool taken,
                     TryLockByte(fd.get(), static_cast<off_t>((first + i) % count_)));
    if (taken) return Slot(std::move(fd));
  }
  // All held: wait for one (a holder's GET is bounded; its neighbours may free sooner, but this
  // one will free).
  RETURN_IF_ERROR(LockByte(fd.get(), static_cast<off_t>(first % count_), deadline, stopped));
  return Slot(std::move(fd));
}

}  // namespace tierd
