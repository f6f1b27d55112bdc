// Small helpers for plain file descriptors: an owner that closes, and loops that finish a read or
// write across short transfers and EINTR. Errors become Status through PosixError.
#ifndef TIERD_COMMON_FD_IO_H_
#define TIERD_COMMON_FD_IO_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

// Closes a file descriptor on scope exit (a negative one is ignored).
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd();
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.Release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  int get() const { return fd_; }
  // Gives up ownership: the caller closes the descriptor.
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  // Closes now, reporting the error that a deferred close would lose (NFS and full disks report
  // write errors there). `what` names the file in the error.
  absl::Status Close(absl::string_view what);

 private:
  int fd_;
};

// Writes all of `data`. `what` names the file in errors.
absl::Status WriteAll(int fd, absl::string_view data, absl::string_view what);
// Reads until `bytes` are in or the input ends; returns how many were read.
absl::StatusOr<size_t> ReadUpTo(int fd, void* data, size_t bytes, absl::string_view what);

}  // namespace tierd

#endif  // TIERD_COMMON_FD_IO_H_
