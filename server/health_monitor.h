// Watches a serving daemon: every period it checks the device (Device::CheckHealth) and that the
// tiers still answer, reports the outcome (the daemon turns it into the health service's SERVING or
// NOT_SERVING), logs each change, and then calls the heartbeat (the systemd watchdog ping).
//
// A lost device makes the daemon NOT_SERVING but the heartbeats go on: restarting cannot bring a
// GPU back, and NOT_SERVING is what tells clients and orchestrators. A tier whose lock never comes
// free stops the heartbeats, so a watchdog restarts the daemon.
#ifndef TIERD_SERVER_HEALTH_MONITOR_H_
#define TIERD_SERVER_HEALTH_MONITOR_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "common/periodic_thread.h"
#include "device/device.h"

namespace tierd {

struct HealthMonitorOptions {
  absl::Duration period = absl::Seconds(1);
  // Takes the tiers' locks and returns (e.g. collects their stats); blocks if one is stuck.
  std::function<void()> probe_tiers;
  // Called with the device's health after every check that changes it (first with the first
  // check's). Must not block.
  std::function<void(bool healthy)> report;
  // Called after every completed round; may be empty.
  std::function<void()> heartbeat;
};

class HealthMonitor {
 public:
  // Runs the first round before returning (so the first report is made), then one every period.
  // `device` must outlive the monitor.
  HealthMonitor(Device& device, HealthMonitorOptions options);
  // Waits for a round in progress.
  ~HealthMonitor() = default;

 private:
  void CheckNow();

  Device& device_;
  const HealthMonitorOptions options_;
  // Touched by the constructor, then only by the monitor's thread.
  bool reported_ = false;
  bool healthy_ = true;
  std::unique_ptr<PeriodicThread> thread_;  // last: started once the rest is built
};

}  // namespace tierd

#endif  // TIERD_SERVER_HEALTH_MONITOR_H_
