#include "common/byte_budget.h"

namespace tierd {

bool ByteBudget::Acquire(uint64_t bytes, absl::FunctionRef<bool()> stopped) {
  absl::MutexLock lock(&mu_);
  const auto fits = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return held_ == 0 || (held_ <= budget_ && bytes <= budget_ - held_);
  };
  while (!fits()) {
    if (stopped()) return false;
    mu_.AwaitWithTimeout(absl::Condition(&fits), absl::Milliseconds(100));
  }
  held_ += bytes;
  return true;
}

void ByteBudget::Release(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_ -= bytes;
}

uint64_t ByteBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

}  // namespace tierd
