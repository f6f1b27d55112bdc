#include "device/shared_event.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>
#include <limits>

namespace tierd {
namespace {

// Shared (not FUTEX_PRIVATE) operations: the word lives in memory other processes map.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  struct timespec ts = absl::ToTimespec(timeout);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE,
            std::numeric_limits<int>::max(), nullptr, nullptr, 0);
}

}  // namespace

void SharedEvent::Complete(uint64_t n) {
  uint64_t current = completed.load(std::memory_order_acquire);
  while (current < n && !completed.compare_exchange_weak(current, n, std::memory_order_acq_rel)) {
  }
  wake_count.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) != 0) FutexWakeAll(&wake_count);
}

bool SharedEvent::WaitFor(uint64_t n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!IsComplete(n)) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    // Announce the sleep, then read the futex word, then re-check: a completion that lands after
    // the re-check bumps the word, so futex_wait returns at once instead of missing the wake.
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = wake_count.load(std::memory_order_seq_cst);
    if (!IsComplete(n)) FutexWait(&wake_count, seen, left);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  return true;
}

}  // namespace tierd
