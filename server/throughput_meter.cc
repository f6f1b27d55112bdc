#include "server/throughput_meter.h"

namespace tierd {

const char* StageName(Stage stage) {
  switch (stage) {
    case Stage::kDiskToHost:
      return "disk_to_host";
    case Stage::kHostToGpu:
      return "host_to_gpu";
    case Stage::kGpuToHost:
      return "gpu_to_host";
    case Stage::kHostToDisk:
      return "host_to_disk";
  }
  return "unknown";
}

StageCounts StageBytes(const v1::Stats& stats) {
  return {stats.bytes_disk_to_host(), stats.bytes_host_to_gpu(), stats.bytes_gpu_to_host(),
          stats.bytes_host_to_disk()};
}

void ThroughputMeter::Sample(absl::Time now, const StageCounts& bytes) {
  absl::MutexLock lock(&mu_);
  samples_.emplace_back(now, bytes);
  while (samples_.size() > 2 && samples_[1].first <= now - window_) samples_.pop_front();
}

StageRates ThroughputMeter::Rates() const {
  absl::MutexLock lock(&mu_);
  StageRates rates{};
  if (samples_.size() < 2) return rates;
  const auto& [first_time, first] = samples_.front();
  const auto& [last_time, last] = samples_.back();
  const double seconds = absl::ToDoubleSeconds(last_time - first_time);
  if (seconds <= 0) return rates;
  for (int i = 0; i < kStageCount; ++i) {
    rates[i] = static_cast<double>(last[i] - first[i]) / seconds;
  }
  return rates;
}

}  // namespace tierd
