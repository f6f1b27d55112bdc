// The state of one HostDevice event, laid out in shared memory so that any process mapping it can
// record, query and wait on it. Waiting sleeps on a futex (shared, not process-private), so a
// waiter burns no core.
//
// Records are numbered: RecordEvent takes the next number and enqueues "complete #n" on its stream;
// a waiter snapshots the newest number and sleeps until that many records have completed. Numbers
// only grow, so a re-record never un-completes a wait that was already satisfied. All zero (fresh
// shared memory) is the never-recorded, complete state; counters are never reset, so a slot handed
// to a new event while an old record is still in flight simply completes when that record does.
#ifndef TIERD_DEVICE_SHARED_EVENT_H_
#define TIERD_DEVICE_SHARED_EVENT_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tierd {

struct alignas(64) SharedEvent {
  std::atomic<uint64_t> recorded;    // number of the most recent record
  std::atomic<uint64_t> completed;   // highest record number whose work has completed
  std::atomic<uint32_t> wake_count;  // futex word: bumped on every completion
  std::atomic<uint32_t> sleepers;    // waiters inside futex_wait, to skip needless wakes

  // Claims the next record number; the caller arranges for Complete(n) to run after the work.
  uint64_t BeginRecord() { return recorded.fetch_add(1, std::memory_order_acq_rel) + 1; }
  // Marks record `n` complete and wakes sleepers.
  void Complete(uint64_t n);
  bool IsComplete(uint64_t n) const { return completed.load(std::memory_order_acquire) >= n; }
  uint64_t Newest() const { return recorded.load(std::memory_order_acquire); }
  // Sleeps until record `n` completes or `timeout` passes; true when complete.
  bool WaitFor(uint64_t n, absl::Duration timeout);
};

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory events need address-free atomics");
static_assert(sizeof(SharedEvent) == 64, "one event per cache line");

}  // namespace tierd

#endif  // TIERD_DEVICE_SHARED_EVENT_H_
