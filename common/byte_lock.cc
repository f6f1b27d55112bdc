#include "common/byte_lock.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "common/posix_error.h"

namespace tierd {

absl::StatusOr<bool> TryLockByte(int fd, off_t offset) {
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = offset;
  lock.l_len = 1;
  while (::fcntl(fd, F_OFD_SETLK, &lock) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EACCES) return false;
    return PosixError("locking a byte", errno);
  }
  return true;
}

absl::Status LockByte(int fd, off_t offset, absl::Time deadline,
                      absl::FunctionRef<bool()> stopped) {
  absl::Duration pause = absl::Microseconds(500);
  while (true) {
    absl::StatusOr<bool> taken = TryLockByte(fd, offset);
    if (!taken.ok()) return taken.status();
    if (*taken) return absl::OkStatus();
    if (stopped()) return absl::CancelledError("stopped while waiting for a lock");
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError("a lock another reader held was not let go in time");
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

}  // namespace tierd
