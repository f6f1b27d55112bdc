// One GPU tier's interprocess events, numbered so that its clients open each handle once and refer
// to it by id. A process may create only so many interprocess events (docs/DESIGN.md,
// "Interprocess events"), so the pool is bounded below that: the daemon splits --max-events
// between its tiers (the default client group's and each client group's). Nothing holds an event
// per lease: a slot is acquired for a GPU copy whose readers must wait for it, for a session (its
// done events, which the client records and names in releases and commits) or for a copy through
// the host handoff buffer, and released when nobody can wait on it any more; only then is it handed
// out again. Events are created in batches, the first at start, so that creating one is rarely on
// a request's path.
//
// A handle once sent cannot be taken back: a client may keep it and record the event whenever it
// likes. So the pool's events never leave it (each client group's tier has a pool of its own,
// whose handles go to that group's sessions only), and an event keeps the use it was first
// acquired for: one that clients record (a done event) is never handed out as one that only the
// daemon records and clients wait on (a ready event), where a stale record would let readers in
// before the bytes land.
//
// Thread-safe. Event pointers stay valid for the pool's life.
#ifndef TIERD_GPU_EVENT_POOL_H_
#define TIERD_GPU_EVENT_POOL_H_

#include <cstdint>
#include <deque>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/figures.h"
#include "device/device.h"

namespace tierd {

struct EventInfo {
  uint32_t id = 0;
  std::string handle;
};

// What the pool reports (Stats: events, events_in_use, events_max, event_shortfalls).
struct EventPoolStats {
  uint64_t created = 0;
  uint64_t in_use = 0;
  uint64_t max = 0;
  // Times a request found no event free: a copy answered once complete instead of at once, a
  // session given fewer done events than it asked for, a copy through the host refused.
  uint64_t shortfalls = 0;
};

inline constexpr Figure<EventPoolStats> kEventPoolFigures[] = {
    {"events", &EventPoolStats::created},
    {"events_in_use", &EventPoolStats::in_use},
    {"events_max", &EventPoolStats::max},
    {"event_shortfalls", &EventPoolStats::shortfalls},
};
static_assert(std::size(kEventPoolFigures) * sizeof(uint64_t) == sizeof(EventPoolStats),
              "every member of EventPoolStats has its line in kEventPoolFigures");

// Who records an event: what it is acquired for, and all it is ever acquired for again.
enum class EventUse {
  kDaemonRecords,  // ready events: the daemon records them after a copy, clients wait on them
  kClientRecords,  // done events: a session's client records them after its last use of a buffer
};

class EventPool {
 public:
  // The flag that sizes the pool, named in its RESOURCE_EXHAUSTED answers.
  static constexpr const char* kSizeFlag = "--max-events";

  // At most `max_events` events (of them, at most three quarters for kClientRecords), created
  // `batch` at a time.
  EventPool(Device& device, uint32_t max_events, uint32_t batch = 64);
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // Creates the first batch now, so that the first requests do not. The device's error when even
  // one cannot be created.
  absl::Status Prefill() ABSL_LOCKS_EXCLUDED(mu_);

  // A free slot's id for `use`: one released after the same use, or a new one. RESOURCE_EXHAUSTED,
  // naming the pool's size and its flag, when all max_events exist and none of them is free for
  // `use` (counted as a shortfall); the device's errors when creating more fails.
  absl::StatusOr<uint32_t> Acquire(EventUse use) ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: `id` was acquired and not released since, and no record of it can still be waited
  // on by anyone who would be misled by a new owner's records.
  void Release(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);

  Event& event(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& handle(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<EventInfo> Events() const ABSL_LOCKS_EXCLUDED(mu_);
  EventPoolStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t max_events() const { return max_events_; }

 private:
  // How many more events for `use` may be created: done events (kClientRecords) take at most
  // three quarters of the pool, so that copies always have events to come.
  uint32_t RoomLocked(EventUse use) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates up to `batch_` more events, free for `use`; the device's error when none could be.
  absl::Status GrowLocked(EventUse use) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<uint32_t>& FreeLocked(EventUse use) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return use == EventUse::kClientRecords ? free_for_clients_ : free_for_daemon_;
  }

  Device& device_;
  const uint32_t max_events_;
  const uint32_t batch_;
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Event>> events_ ABSL_GUARDED_BY(mu_);  // by id; a deque never moves
  std::vector<EventUse> use_ ABSL_GUARDED_BY(mu_);                  // by id, from its creation
  std::vector<uint32_t> free_for_daemon_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_for_clients_ ABSL_GUARDED_BY(mu_);
  uint32_t created_for_clients_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t shortfalls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_GPU_EVENT_POOL_H_
