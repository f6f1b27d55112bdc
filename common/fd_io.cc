#include "common/fd_io.h"

#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/posix_error.h"

namespace tierd {

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

absl::Status ScopedFd::Close(absl::string_view what) {
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return PosixError(absl::StrCat("closing ", what), errno);
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, absl::string_view data, absl::string_view what) {
  while (!data.empty()) {
    const ssize_t written = ::write(fd, data.data(), data.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return PosixError(absl::StrCat("writing ", what), errno);
    }
    data.remove_prefix(static_cast<size_t>(written));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> ReadUpTo(int fd, void* data, size_t bytes, absl::string_view what) {
  char* next = static_cast<char*>(data);
  size_t total = 0;
  while (total < bytes) {
    const ssize_t got = ::read(fd, next + total, bytes - total);
    if (got < 0) {
      if (errno == EINTR) continue;
      return PosixError(absl::StrCat("reading ", what), errno);
    }
    if (got == 0) break;
    total += static_cast<size_t>(got);
  }
  return total;
}

}  // namespace tierd
