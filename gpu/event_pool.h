// The daemon's interprocess events, numbered so clients can open each handle once and refer to it
// by id. A slot is acquired for one purpose (a GPU copy's ready event, a lease's done event, a
// reservation's written event) and released when nobody can wait on it any more; only then is it
// handed out again. The pool grows in batches up to a limit.
//
// Thread-safe. Event pointers stay valid for the pool's life.
#ifndef TIERD_GPU_EVENT_POOL_H_
#define TIERD_GPU_EVENT_POOL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"

namespace tierd {

struct EventInfo {
  uint32_t id = 0;
  std::string handle;
};

class EventPool {
 public:
  // At most `max_events` events, created `batch` at a time.
  EventPool(Device& device, uint32_t max_events, uint32_t batch = 64);
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A free slot's id. RESOURCE_EXHAUSTED when all max_events are in use; the device's errors when
  // creating more fails.
  absl::StatusOr<uint32_t> Acquire() ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: `id` was acquired and not released since.
  void Release(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);

  Event& event(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& handle(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<EventInfo> Events() const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Device& device_;
  const uint32_t max_events_;
  const uint32_t batch_;
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Event>> events_ ABSL_GUARDED_BY(mu_);  // by id; a deque never moves
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_GPU_EVENT_POOL_H_
