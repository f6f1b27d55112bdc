// Work that waits for a client's events on the client's own drain stream: a released lease's buffer
// is reused, an abandoned reservation's range freed, a commit's copy started, only once the
// event the client named (one of its done events) has completed. A drain completes when the device
// says so, or is forced when its client's close grace runs out; the event slots it owns go back to
// the pool in the first case; in the second, those whose newest record is still pending are
// retired, since that record may never complete.
//
// A drain waits for the newest record of each event at the time its wait is enqueued, which may be
// later than the client's release: a client records a done event again only on the same stream or
// after the earlier record completed (the lease protocol), so the newest record covers every
// earlier one — at worst the buffer is reused a little later than it could have been.
//
// Internal to the GPU tier. Its state is guarded by the tier's lock: completing a drain frees what
// the residency and the commit pipeline hold. Methods say REQUIRES: the tier's lock when it must be
// held.
#ifndef TIERD_GPU_DETAIL_DRAIN_QUEUE_H_
#define TIERD_GPU_DETAIL_DRAIN_QUEUE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "common/deferred_calls.h"
#include "common/liveness.h"
#include "common/timer_thread.h"
#include "device/device.h"
#include "gpu/detail/client_table.h"
#include "gpu/detail/staging_residency.h"
#include "gpu/event_pool.h"

namespace tierd {

class DrainQueue {
 public:
  using Deferred = DeferredCalls::Calls;
  // What a drain does once its event completed (`forced`: or once its client's grace ran out,
  // when the event says nothing). Runs under the tier's lock; defers its callbacks.
  using OnDrained = absl::AnyInvocable<void(bool forced, Deferred& deferred)>;

  // All references must outlive this; the timer's pending calls must run (or the timer go)
  // before the rest of the tier does.
  DrainQueue(absl::Mutex& tier_mu, Device& device, EventPool& events, ClientTable& clients,
             StagingResidency& residency, TimerThread& timer, std::shared_ptr<Liveness> liveness)
      : mu_(tier_mu),
        device_(device),
        events_(events),
        clients_(clients),
        residency_(residency),
        timer_(timer),
        liveness_(std::move(liveness)) {}
  DrainQueue(const DrainQueue&) = delete;
  DrainQueue& operator=(const DrainQueue&) = delete;

  // ---- REQUIRES: the tier's lock, for all of these.
  // Runs `on_drained` once the newest records of `wait_on`, waited for on the client's drain
  // stream, have completed — at once, through `deferred`'s lock scope, when `wait_on` is empty —
  // or the client's close grace ran out (then forced). `owned` events are handed out again after
  // a drain that completed; after a forced one, only those whose newest record has completed.
  void Start(GpuClient& client, std::vector<uint32_t> wait_on, std::vector<uint32_t> owned,
             OnDrained on_drained, Deferred& deferred);
  // Completes drain `drain_id` (nothing when it completed already), then serves the requests
  // waiting for staging room.
  void Finish(uint64_t drain_id, bool forced, Deferred& deferred);
  // Whether any drain is in flight (its completion may free staging room).
  bool pending() const;
  // Drains forced while their client's done event was still pending: the drain stream may wait
  // on it forever, and so would anything that synchronizes the whole device (freeing the pool).
  uint64_t abandoned_waits() const;

 private:
  struct Drain {
    ClientId client = 0;
    std::vector<uint32_t> owned;  // handed out again once the drain completes
    OnDrained on_drained;
  };

  // The device says the drain's event completed.
  void Drained(uint64_t drain_id) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex& mu_;
  Device& device_;
  EventPool& events_;
  ClientTable& clients_;
  StagingResidency& residency_;
  TimerThread& timer_;
  const std::shared_ptr<Liveness> liveness_;
  std::map<uint64_t, Drain> drains_ ABSL_GUARDED_BY(mu_);
  uint64_t next_drain_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t abandoned_waits_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_DRAIN_QUEUE_H_
