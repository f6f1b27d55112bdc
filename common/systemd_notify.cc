#include "common/systemd_notify.h"

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/posix_error.h"

namespace tierd {

SystemdNotifier::SystemdNotifier(std::string socket_path,
                                 std::optional<absl::Duration> watchdog_interval)
    : socket_path_(std::move(socket_path)), watchdog_interval_(watchdog_interval) {}

SystemdNotifier SystemdNotifier::FromEnvironment() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  std::string socket_path = socket != nullptr ? socket : "";
  std::optional<absl::Duration> watchdog;
  const char* usec = std::getenv("WATCHDOG_USEC");
  const char* pid = std::getenv("WATCHDOG_PID");
  uint64_t interval_us = 0;
  int64_t watchdog_pid = 0;
  // WATCHDOG_PID names the process the pings are expected from; a child that inherited the
  // variables must not ping for its parent.
  const bool for_us =
      pid == nullptr || (absl::SimpleAtoi(pid, &watchdog_pid) && watchdog_pid == ::getpid());
  if (usec != nullptr && for_us && absl::SimpleAtoi(usec, &interval_us) && interval_us > 0) {
    watchdog = absl::Microseconds(static_cast<int64_t>(interval_us));
  }
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
  return SystemdNotifier(std::move(socket_path), watchdog);
}

absl::Status SystemdNotifier::Notify(absl::string_view state) const {
  if (!enabled()) return absl::OkStatus();
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof(address.sun_path) ||
      (socket_path_[0] != '/' && socket_path_[0] != '@')) {
    return absl::InvalidArgumentError(
        absl::StrCat("NOTIFY_SOCKET \"", socket_path_, "\" is not a socket path"));
  }
  std::memcpy(address.sun_path, socket_path_.data(), socket_path_.size());
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_path_.size());
  if (socket_path_[0] == '@') {
    address.sun_path[0] = '\0';  // an abstract address: no terminating NUL counted
  } else {
    ++length;
  }
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("creating the systemd notification socket", errno);
  const ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                                reinterpret_cast<const sockaddr*>(&address), length);
  const int saved = errno;
  ::close(fd);
  if (sent < 0) return PosixError(absl::StrCat("notifying systemd at ", socket_path_), saved);
  if (static_cast<size_t>(sent) != state.size()) {
    return absl::InternalError(
        absl::StrCat("notifying systemd: sent ", sent, " of ", state.size(), " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace tierd
