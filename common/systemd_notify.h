// Telling systemd how the daemon is doing: the sd_notify protocol (a datagram of "KEY=VALUE" lines
// to $NOTIFY_SOCKET), which systemd documents as a stable interface to reimplement, so tierd does
// not load libsystemd. Type=notify units wait for READY=1; WatchdogSec= units restart a daemon that
// stops sending WATCHDOG=1.
//
//   SystemdNotifier systemd = SystemdNotifier::FromEnvironment();
//   systemd.Notify("READY=1\nSTATUS=serving");
//
// Without $NOTIFY_SOCKET (not started by systemd) every call does nothing and succeeds.
// Thread-safe.
#ifndef TIERD_COMMON_SYSTEMD_NOTIFY_H_
#define TIERD_COMMON_SYSTEMD_NOTIFY_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tierd {

class SystemdNotifier {
 public:
  // Reads $NOTIFY_SOCKET (a path, or an abstract address starting with '@'), $WATCHDOG_USEC and
  // $WATCHDOG_PID, then unsets them, so processes this one starts do not speak for it.
  static SystemdNotifier FromEnvironment();
  // A notifier that sends to `socket_path` (same syntax as $NOTIFY_SOCKET); empty: disabled.
  explicit SystemdNotifier(std::string socket_path,
                           std::optional<absl::Duration> watchdog_interval = std::nullopt);

  bool enabled() const { return !socket_path_.empty(); }
  // The interval systemd expects WATCHDOG=1 within (WatchdogSec=), when it asked for pings from
  // this process; ping at half of it.
  std::optional<absl::Duration> watchdog_interval() const { return watchdog_interval_; }

  // Sends `state`, newline-separated assignments such as "READY=1\nSTATUS=serving".
  // Errors: the socket's (the daemon logs them and goes on: systemd's view of it is not its job).
  absl::Status Notify(absl::string_view state) const;

 private:
  std::string socket_path_;
  std::optional<absl::Duration> watchdog_interval_;
};

}  // namespace tierd

#endif  // TIERD_COMMON_SYSTEMD_NOTIFY_H_
