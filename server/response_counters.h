// Requests answered, by status code: every session request and unary call, for the metrics
// endpoint (tierd_requests_total{code=...}). Lock-free; thread-safe.
#ifndef TIERD_SERVER_RESPONSE_COUNTERS_H_
#define TIERD_SERVER_RESPONSE_COUNTERS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace tierd {

class ResponseCounters {
 public:
  // absl::StatusCode runs from kOk (0) to kUnauthenticated (16).
  static constexpr int kCodes = 17;

  void Count(absl::StatusCode code) {
    const int index = static_cast<int>(code);
    counts_[index >= 0 && index < kCodes ? index : static_cast<int>(absl::StatusCode::kUnknown)]
        .fetch_add(1, std::memory_order_relaxed);
  }

  std::array<uint64_t, kCodes> Snapshot() const {
    std::array<uint64_t, kCodes> counts;
    for (int i = 0; i < kCodes; ++i) counts[i] = counts_[i].load(std::memory_order_relaxed);
    return counts;
  }

 private:
  std::array<std::atomic<uint64_t>, kCodes> counts_{};
};

}  // namespace tierd

#endif  // TIERD_SERVER_RESPONSE_COUNTERS_H_
