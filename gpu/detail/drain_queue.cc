#include "gpu/detail/drain_queue.h"

#include <utility>

#include "common/log.h"

namespace tierd {

void DrainQueue::Start(GpuClient& client, std::vector<uint32_t> wait_on,
                       std::vector<uint32_t> owned, OnDrained on_drained, Deferred& deferred) {
  mu_.AssertHeld();
  if (wait_on.empty()) {
    for (uint32_t event : owned) events_.Release(event);
    on_drained(/*forced=*/false, deferred);
    residency_.RetryAllocations(deferred);
    return;
  }
  const uint64_t id = next_drain_++;
  drains_[id] = Drain{client.id, std::move(owned), std::move(on_drained)};
  client.drains.insert(id);
  std::vector<Event*> events;
  events.reserve(wait_on.size());
  for (uint32_t event : wait_on) events.push_back(&events_.event(event));
  // The device calls are made on the timer thread, not here: a release is on the path of the
  // session's next request (a session's requests are handled in order), and there its device calls
  // slowed the next fetch (bench/results/README.md, "What it took"). The drain is registered
  // already, so its callback finds it; were it forced meanwhile (the session closed), the callback
  // finds it gone and the wait only delays the retired slots' stream, which the stream reference
  // keeps.
  timer_.RunAfter(absl::ZeroDuration(), [this, stream = client.drain_stream, client_id = client.id,
                                         events = std::move(events), id] {
    // Usually the client's work is over by now: then the drain completes here, without a wait and
    // a completion callback on the device (two device calls, and the callback's thread, per
    // release under load).
    bool completed = true;
    for (Event* event : events) {
      absl::StatusOr<bool> done = device_.QueryEvent(*event);
      completed = done.ok() && *done;
      if (!completed) break;
    }
    if (completed) {
      liveness_->RunIfAlive([&] { Drained(id); });
      return;
    }
    absl::Status status;
    for (Event* event : events) {
      if (status.ok()) status = device_.WaitEvent(*stream, *event);
    }
    if (status.ok()) {
      status = device_.NotifyWhenDone(
          *stream, [this, live = liveness_, id] { live->RunIfAlive([&] { Drained(id); }); });
    }
    if (!status.ok()) {
      // Without the wait nothing says when the client is done: the drain stays pending, so what
      // it holds is freed only by the close grace when the session ends.
      TIERD_LOG(ERROR) << "session " << client_id << ": cannot wait for its event (" << status
                       << "); its buffer is freed when the session ends";
    }
  });
}

void DrainQueue::Drained(uint64_t drain_id) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Finish(drain_id, /*forced=*/false, deferred.calls());
}

void DrainQueue::Finish(uint64_t drain_id, bool forced, Deferred& deferred) {
  mu_.AssertHeld();
  auto it = drains_.find(drain_id);
  if (it == drains_.end()) return;  // forced earlier
  Drain drain = std::move(it->second);
  drains_.erase(it);
  if (GpuClient* client = clients_.FindAny(drain.client); client != nullptr) {
    client->drains.erase(drain_id);
  }
  // A forced drain's event may still have a record pending that will never complete; a later
  // owner would wait on it forever. Retire the slot instead.
  for (uint32_t event : drain.owned) {
    // An event whose newest record has completed misleads nobody, forced or not; one whose record
    // may never complete (its client died with work queued) would make a later owner wait for
    // ever: it is retired.
    absl::StatusOr<bool> complete =
        forced ? device_.QueryEvent(events_.event(event)) : absl::StatusOr<bool>(true);
    if (complete.ok() && *complete) events_.Release(event);
  }
  if (forced) ++abandoned_waits_;
  drain.on_drained(forced, deferred);
  residency_.RetryAllocations(deferred);
}

bool DrainQueue::pending() const {
  mu_.AssertHeld();
  return !drains_.empty();
}

uint64_t DrainQueue::abandoned_waits() const {
  mu_.AssertHeld();
  return abandoned_waits_;
}

}  // namespace tierd
