// Bytes of memory shared by work that takes some for a while — registrations parsing requests and
// headers, readers holding what they read before it is parsed — so that however many run at once,
// together they hold at most the budget. A request larger than the whole budget is let through
// alone (once nothing else holds any), never refused outright.
//
// Thread-safe.
#ifndef TIERD_COMMON_BYTE_BUDGET_H_
#define TIERD_COMMON_BYTE_BUDGET_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

class ByteBudget {
 public:
  explicit ByteBudget(uint64_t bytes) : budget_(bytes) {}
  ByteBudget(const ByteBudget&) = delete;
  ByteBudget& operator=(const ByteBudget&) = delete;

  // Takes `bytes`, waiting until they fit beside those held (or nothing is held). False, taking
  // nothing, once `stopped` returns true (it is asked every 100 ms while waiting).
  bool Acquire(uint64_t bytes, absl::FunctionRef<bool()> stopped) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back bytes Acquire took.
  void Release(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t held() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t budget() const { return budget_; }

 private:
  const uint64_t budget_;
  mutable absl::Mutex mu_;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

// Holds bytes of a budget for a scope.
class HeldBytes {
 public:
  HeldBytes(ByteBudget& budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  ~HeldBytes() { budget_.Release(bytes_); }
  HeldBytes(const HeldBytes&) = delete;
  HeldBytes& operator=(const HeldBytes&) = delete;

 private:
  ByteBudget& budget_;
  const uint64_t bytes_;
};

}  // namespace tierd

#endif  // TIERD_COMMON_BYTE_BUDGET_H_
