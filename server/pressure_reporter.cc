#include "server/pressure_reporter.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"

namespace tierd {
namespace {

std::string PercentUsed(const v1::TierStats& tier) {
  if (tier.budget_bytes() == 0) return "0%";
  return absl::StrFormat("%.0f%%", 100.0 * static_cast<double>(tier.used_bytes()) /
                                       static_cast<double>(tier.budget_bytes()));
}

}  // namespace

std::optional<std::string> PressureReporter::Observe(absl::Time now, const v1::Stats& stats,
                                                     uint64_t exhausted) {
  const Counts current{stats.gpu().evictions(), stats.host().evictions(), exhausted,
                       stats.event_shortfalls()};
  if (!since_.has_value()) {
    since_ = now;
    baseline_ = current;
    return std::nullopt;
  }
  if (now - *since_ < period_) return std::nullopt;
  const uint64_t gpu = current.gpu_evictions - baseline_.gpu_evictions;
  const uint64_t host = current.host_evictions - baseline_.host_evictions;
  const uint64_t refused = current.exhausted - baseline_.exhausted;
  const uint64_t short_of_events = current.event_shortfalls - baseline_.event_shortfalls;
  const absl::Duration elapsed = now - *since_;
  since_ = now;
  baseline_ = current;
  if (gpu + host + refused + short_of_events == 0) return std::nullopt;
  std::string line = absl::StrCat(
      "eviction pressure over the last ",
      absl::FormatDuration(absl::Trunc(elapsed, absl::Seconds(1))), ": ", gpu, " GPU and ", host,
      " host eviction(s), ", refused, " request(s) refused RESOURCE_EXHAUSTED; GPU pool ",
      PercentUsed(stats.gpu()), " used, host cache ", PercentUsed(stats.host()), " used");
  if (short_of_events > 0) {
    absl::StrAppend(&line, "; ", short_of_events, " request(s) found no interprocess event free (",
                    stats.events_in_use(), " of --max-events=", stats.events_max(),
                    " in use: copies answered once complete, sessions given fewer done events)");
  }
  TIERD_LOG(INFO) << line;
  return line;
}

}  // namespace tierd
