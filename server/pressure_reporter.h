// One log line per period in which the tiers were under pressure: objects evicted for room or
// requests refused RESOURCE_EXHAUSTED, with how full each tier was. Fed with the daemon's stats
// every second; quiet while nothing is evicted or refused. Not thread-safe: one feeder.
#ifndef TIERD_SERVER_PRESSURE_REPORTER_H_
#define TIERD_SERVER_PRESSURE_REPORTER_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

class PressureReporter {
 public:
  explicit PressureReporter(absl::Duration period) : period_(period) {}

  // `exhausted`: requests answered RESOURCE_EXHAUSTED so far. Logs once `period` has passed since
  // the last line (or the first observation) and something was evicted or refused meanwhile.
  // Returns the line logged, if any.
  std::optional<std::string> Observe(absl::Time now, const v1::Stats& stats, uint64_t exhausted);

 private:
  struct Counts {
    uint64_t gpu_evictions = 0;
    uint64_t host_evictions = 0;
    uint64_t exhausted = 0;
    uint64_t event_shortfalls = 0;
  };

  const absl::Duration period_;
  std::optional<absl::Time> since_;
  Counts baseline_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_PRESSURE_REPORTER_H_
