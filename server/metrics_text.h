// The daemon's metrics in Prometheus' text exposition format (version 0.0.4), as served on
// --metrics-port at /metrics. Every metric is named tierd_*; bytes are in bytes, rates in bytes per
// second. docs/CONFIGURATION.md, "Metrics", lists them.
#ifndef TIERD_SERVER_METRICS_TEXT_H_
#define TIERD_SERVER_METRICS_TEXT_H_

#include <array>
#include <cstdint>
#include <string>

#include "server/response_counters.h"
#include "server/throughput_meter.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

struct MetricsSnapshot {
  bool serving = false;  // what the health service says
  v1::Stats stats;
  StageRates stage_rates{};
  std::array<uint64_t, ResponseCounters::kCodes> responses{};
};

std::string RenderPrometheusText(const MetricsSnapshot& snapshot);

}  // namespace tierd

#endif  // TIERD_SERVER_METRICS_TEXT_H_
