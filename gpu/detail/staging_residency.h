// Which objects are in GPU staging: the objects listed by key, their least-recently-used order,
// eviction, and the allocation of staging ranges with the requests that wait for room.
//
// Nothing leased, pinned, copying, loading or waited for is evicted. A request that does not fit
// waits when copies or drains in flight may free room (served in order, no polling), and is
// refused RESOURCE_EXHAUSTED at once otherwise.
//
// Internal to the GPU tier. Its state is guarded by the tier's lock, not one of its own: leases,
// pins and drains (client_table.h, drain_queue.h) decide whether an object may be evicted or
// freed, and they change together with it. Methods say REQUIRES: the tier's lock when it must be
// held; callbacks are queued on `deferred` to run after it is released.
#ifndef TIERD_GPU_DETAIL_STAGING_RESIDENCY_H_
#define TIERD_GPU_DETAIL_STAGING_RESIDENCY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/deferred_calls.h"
#include "device/device.h"
#include "gpu/detail/liveness.h"
#include "gpu/detail/staging_object.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/staging_pool.h"
#include "storage/catalog.h"

namespace tierd {

class StagingResidency {
 public:
  using Deferred = DeferredCalls::Calls;
  using AllocationCallback = absl::AnyInvocable<void(absl::StatusOr<StagingRange>) &&>;

  // All references must outlive this; `tier_mu` guards this object's state and `stats`.
  // `drains_pending` says (under the lock) whether client drains in flight may still free room.
  StagingResidency(absl::Mutex& tier_mu, Device& device, const Catalog& catalog, StagingPool& pool,
                   EventPool& events, GpuTierStats& stats, std::shared_ptr<Liveness> liveness,
                   std::function<bool()> drains_pending);
  StagingResidency(const StagingResidency&) = delete;
  StagingResidency& operator=(const StagingResidency&) = delete;

  // ---- Objects by key. REQUIRES: the tier's lock, for all of these.
  // The listed object for `key`, unless it is a weight of an older registration (then it is
  // unlisted and nullptr returned).
  StagingObject* FindListed(const std::string& key);
  // The listed object for `key` as it is, or nullptr.
  const StagingObject* Listed(const std::string& key) const;
  // The listed objects whose key is `key_or_prefix` (or starts with it, when `prefix`).
  std::vector<StagingObject*> Matching(const std::string& key_or_prefix, bool prefix);
  // Lists `object` under its key. REQUIRES: no object is listed under that key.
  void List(StagingObject* object);
  // Lists `object` in place of whatever was listed under its key, and marks it used.
  void Replace(StagingObject* object);
  void Unlist(StagingObject* object);
  size_t listed_count() const;
  // Marks `object` most recently used.
  void Touch(StagingObject* object);
  // Touches a listed object; frees an unlisted one that nothing uses any more.
  void TouchOrDeleteIfUnused(StagingObject* object);
  bool IsEvictable(const StagingObject* object) const;
  // Unlists and deletes `object`, freeing its range and ready event.
  void Free(StagingObject* object);
  // Frees an unlisted object that nothing uses any more.
  void DeleteIfUnused(StagingObject* object);
  // Deletes every listed object (the tier's teardown).
  void DeleteAllListed();

  // ---- Room. REQUIRES: the tier's lock, for all of these.
  // A staging range of `bytes`, evicting LRU objects as needed; nullopt when that is not enough.
  std::optional<StagingRange> TryAllocate(uint64_t bytes);
  // Allocates now, once copies or drains in flight free room, or fails RESOURCE_EXHAUSTED.
  void Allocate(uint64_t bytes, AllocationCallback done, Deferred& deferred);
  // Serves the requests waiting for room, in order, as far as there is room now.
  void RetryAllocations(Deferred& deferred);
  size_t allocation_waiters() const;
  // A copy into or out of staging started / completed: until then the room it will free may be
  // waited for.
  void CopyStarted();
  void CopyFinished();
  uint64_t copies_in_flight() const;
  // Returns a range (and its event) to the pools now.
  void FreeRange(StagingRange range, std::optional<uint32_t> event);
  // After a copy failed part-way, pieces of it may still be queued on `stream`: `range` and
  // `event` are freed once the stream has run them. Where the device cannot even arrange that,
  // they are retired for good (the pool is that much smaller) rather than risk handing them out
  // while the device still uses them. `what` and `error` are for the log.
  void FreeAfterStream(Stream& stream, StagingRange range, std::optional<uint32_t> event,
                       const std::string& what, const absl::Status& error);

 private:
  absl::Status PoolExhausted(uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeAfterFailedCopy(StagingRange range, std::optional<uint32_t> event)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool RoomMayCome() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex& mu_;
  Device& device_;
  const Catalog& catalog_;
  StagingPool& pool_;
  EventPool& events_;
  GpuTierStats& stats_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Liveness> liveness_;
  const std::function<bool()> drains_pending_;

  struct AllocationWaiter {
    uint64_t bytes = 0;
    AllocationCallback done;
  };
  std::map<std::string, StagingObject*> objects_ ABSL_GUARDED_BY(mu_);  // listed, by key
  // Resident listed objects, least recent first.
  std::list<StagingObject*> lru_ ABSL_GUARDED_BY(mu_);
  std::deque<AllocationWaiter> allocation_waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t copies_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_STAGING_RESIDENCY_H_
