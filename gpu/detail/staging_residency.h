// Which objects are in GPU staging: the objects listed by key, their least-recently-used order,
// eviction, and the allocation of staging ranges with the requests that wait for room. The
// objects live in a ResidencyTable (common/residency.h, LRU), which owns them and their ranges.
//
// Nothing leased, pinned, copying, loading or waited for is evicted or freed. A request that does
// not fit waits when copies or drains in flight may free room (served in order, no polling), and
// is refused RESOURCE_EXHAUSTED at once otherwise.
//
// Internal to the GPU tier. Its state is guarded by the tier's lock, not one of its own: leases,
// pins and drains (client_table.h, drain_queue.h) decide whether an object may be evicted or
// freed, and they change together with it. Methods say REQUIRES: the tier's lock when it must be
// held; callbacks are queued on `deferred` to run after it is released.
#ifndef TIERD_GPU_DETAIL_STAGING_RESIDENCY_H_
#define TIERD_GPU_DETAIL_STAGING_RESIDENCY_H_

#include <cstdint>
#include <functional>
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
#include "common/liveness.h"
#include "device/device.h"
#include "gpu/detail/staging_object.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/staging_pool.h"
#include "storage/model/catalog.h"

namespace tierd {

class StagingResidency : private StagingObjectTable::Owner {
 public:
  using Deferred = DeferredCalls::Calls;
  using AllocationCallback = StagingObjectTable::AllocationCallback;

  // All references must outlive this; `tier_mu` guards this object's state and `stats`.
  // `drains_pending` says (under the lock) whether client drains in flight may still free room.
  // The objects left are destroyed with this, their ranges going back to `pool`.
  StagingResidency(absl::Mutex& tier_mu, Device& device, const Catalog& catalog, StagingPool& pool,
                   EventPool& events, GpuTierStats& stats, std::shared_ptr<Liveness> liveness,
                   std::function<bool()> drains_pending);
  StagingResidency(const StagingResidency&) = delete;
  StagingResidency& operator=(const StagingResidency&) = delete;

  // ---- Objects by key. REQUIRES: the tier's lock, for all of these.
  // The listed object for `key`, unless it is a weight of an older registration (then it is
  // removed, freed once unused, and nullptr returned).
  StagingObject* FindListed(const std::string& key);
  // The listed object for `key` as it is, or nullptr.
  const StagingObject* Listed(const std::string& key) const;
  // The listed objects whose key is `key_or_prefix` (or starts with it, when `prefix`).
  std::vector<StagingObject*> Matching(const std::string& key_or_prefix, bool prefix);
  // A new object under `key`, unlisted and not resident; freed by Remove or FreeIfUnused once
  // unused, or with this.
  StagingObject* Create(std::string key);
  // Lists `object` under its key. REQUIRES: no object is listed under that key.
  void List(StagingObject* object);
  // Lists `object`, resident, in place of whatever was listed under its key (removed, and freed
  // once unused), as the most recently used.
  void Replace(StagingObject* object);
  // `object` became resident: it joins the LRU order as the most recently used.
  void Enqueue(StagingObject* object);
  // Marks a resident `object` most recently used.
  void Touch(StagingObject* object);
  // Touches `object`; frees it if it is unlisted and nothing uses it any more.
  void TouchOrFreeIfUnused(StagingObject* object);
  bool IsEvictable(const StagingObject* object) const;
  // Unlists `object`; it is freed (its range and ready event with it) now if nothing uses it, or
  // by the FreeIfUnused after its last use.
  void Remove(StagingObject* object);
  // Frees an unlisted object that nothing uses any more. Call after each end of a use.
  void FreeIfUnused(StagingObject* object);
  // Gives the object's ready event back to the pool once nobody can wait on it any more: its copy
  // into staging has completed and no lease that names it is held. Call after either ends.
  void DropReadyEventIfUnneeded(StagingObject* object);
  size_t listed_count() const;
  // The next load of `key` should go to `range` (where it was before a retained set slept,
  // gpu/retained_sets.h), if all of it is free then. Replaces an earlier wish for the key.
  void PreferPlacement(const std::string& key, const StagingRange& range);
  // The range wished for `key`, allocated, when there was a wish and all of it is free; the wish
  // is used up either way.
  std::optional<StagingAllocation> TakePreferredPlacement(const std::string& key);
  // Drops the wish for `key`, if any (its load is over, or will not come).
  void ForgetPreferredPlacement(const std::string& key);

  // ---- Room. REQUIRES: the tier's lock, for all of these.
  // A staging range of `bytes`, evicting LRU objects as needed; nullopt when that is not enough.
  std::optional<StagingAllocation> TryAllocate(uint64_t bytes);
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
  // After a copy failed part-way, pieces of it may still be queued on `stream`: `memory` and
  // `event` are freed once the stream has run them. Where the device cannot even arrange that, or
  // the tier is gone by then, they are retired for good (the pool is that much smaller) rather
  // than risk handing them out while the device still uses them. `what` and `error` are for the
  // log.
  void FreeAfterStream(Stream& stream, StagingAllocation memory, std::optional<uint32_t> event,
                       const std::string& what, const absl::Status& error);

 private:
  // StagingObjectTable::Owner, called by the table with the tier's lock held.
  bool InFlight(const StagingObject& object) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanEvict(const StagingObject& object) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Evict(StagingObject& victim) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Destroying(StagingObject& object) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<StagingAllocation> AllocateFree(uint64_t bytes) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WorthEvicting(uint64_t bytes, uint64_t evictable_bytes) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RoomComing(uint64_t bytes) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NoRoom(uint64_t bytes, bool after_waiting) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status PoolExhausted(uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeAfterFailedCopy(StagingAllocation memory, std::optional<uint32_t> event)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex& mu_;
  Device& device_;
  const Catalog& catalog_;
  StagingPool& pool_;
  EventPool& events_;
  GpuTierStats& stats_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Liveness> liveness_;
  const std::function<bool()> drains_pending_;

  StagingObjectTable table_ ABSL_GUARDED_BY(mu_);
  uint64_t copies_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, StagingRange> preferred_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_STAGING_RESIDENCY_H_
