#include "server/health_monitor.h"

#include <utility>

#include "common/log.h"

namespace tierd {

HealthMonitor::HealthMonitor(Device& device, HealthMonitorOptions options)
    : device_(device), options_(std::move(options)) {
  CheckNow();
  thread_ = std::make_unique<PeriodicThread>(options_.period, [this] { CheckNow(); });
}

void HealthMonitor::CheckNow() {
  const absl::Status device = device_.CheckHealth();
  const bool healthy = device.ok();
  if (!reported_ || healthy != healthy_) {
    if (!healthy) {
      TIERD_LOG(ERROR) << "device " << device_.Describe() << " is lost (" << device
                       << "); health is NOT_SERVING";
    } else if (reported_) {
      TIERD_LOG(INFO) << "device " << device_.Describe() << " answers again; health is SERVING";
    }
    reported_ = true;
    healthy_ = healthy;
    options_.report(healthy);
  }
  if (options_.probe_tiers) options_.probe_tiers();
  if (options_.heartbeat) options_.heartbeat();
}

}  // namespace tierd
