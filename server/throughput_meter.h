// Bytes per second of each stage of the tiers (disk -> host, host -> GPU, GPU -> host,
// host -> disk) over a sliding window, from periodic samples of their byte counters: what the
// metrics endpoint shows as tierd_stage_throughput_bytes_per_second. Thread-safe.
#ifndef TIERD_SERVER_THROUGHPUT_METER_H_
#define TIERD_SERVER_THROUGHPUT_METER_H_

#include <array>
#include <cstdint>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

enum class Stage { kDiskToHost, kHostToGpu, kGpuToHost, kHostToDisk };
inline constexpr int kStageCount = 4;
// "disk_to_host", ...: the metrics' label values.
const char* StageName(Stage stage);

using StageCounts = std::array<uint64_t, kStageCount>;
using StageRates = std::array<double, kStageCount>;

// The stages' byte counters in `stats`.
StageCounts StageBytes(const v1::Stats& stats);

class ThroughputMeter {
 public:
  explicit ThroughputMeter(absl::Duration window) : window_(window) {}

  // Adds a sample of the counters taken at `now` (non-decreasing from call to call); samples
  // older than the window are dropped, but the newest one before it is kept as the baseline.
  void Sample(absl::Time now, const StageCounts& bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes per second of each stage between the oldest and the newest sample; zeros until there
  // are two samples.
  StageRates Rates() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const absl::Duration window_;
  mutable absl::Mutex mu_;
  std::deque<std::pair<absl::Time, StageCounts>> samples_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_SERVER_THROUGHPUT_METER_H_
