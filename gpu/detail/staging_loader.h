// Brings objects into staging from the host tier, and answers whoever waits for them: fetches with
// leases, pins with their status.
//
// A load lists a new object for the key, asks the host tier for its bytes (once more, on the
// high-priority path, when a demand fetch joins a prefetch), allocates staging (waiting for room
// when copies or drains will free it), enqueues the copy in chunks on the demand or prefetch
// stream, records the object's ready event and answers its waiters at once: they wait on that
// event, not on the copy. With copy_while_reading, an object read from a local file into the host
// tier is copied on as its bytes land, into staging taken from free room when the first part lands
// (landed_copies.h), the copies enqueued by a thread of the loader's own so that the reader
// threads never wait in the device's driver; its waiters are still answered only once the host
// tier has checked the whole object, after the parts not copied yet. Host bytes held compressed
// are copied compressed and decoded on the GPU (compressed_copies.h); their waiters are answered
// once the decode has been checked, so that bytes that did not decode to their checksums are never
// leased.
//
// Internal to the GPU tier. Its state is guarded by the tier's lock (loads change the objects the
// residency lists and the leases clients hold). Methods say REQUIRES: the tier's lock when it must
// be held; callbacks are queued on `deferred` to run after it is released.
#ifndef TIERD_GPU_DETAIL_STAGING_LOADER_H_
#define TIERD_GPU_DETAIL_STAGING_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/deferred_calls.h"
#include "common/worker_pool.h"
#include "device/device.h"
#include "gpu/chunked_copier.h"
#include "gpu/detail/client_table.h"
#include "gpu/detail/compressed_copies.h"
#include "gpu/detail/handoff_copies.h"
#include "gpu/detail/running_callbacks.h"
#include "gpu/detail/staging_object.h"
#include "gpu/detail/staging_residency.h"
#include "gpu/detail/stored_key_space.h"
#include "gpu/detail/tier_parts.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/gpu_tier_types.h"
#include "gpu/host_source.h"
#include "gpu/staging_pool.h"
#include "storage/host/host_cache.h"
#include "storage/model/catalog.h"

namespace tierd {

class StagingLoader {
 public:
  using Deferred = DeferredCalls::Calls;

  // What is its own beside the tier's shared parts; all must outlive it. The tier's lock guards
  // its state.
  struct Own {
    HostSource& host_source;
    Stream& demand_stream;    // H2D, high priority
    Stream& prefetch_stream;  // H2D
    ClientTable& clients;
    HandoffCopies& handoff;
    const StoredKeySpace& stored;
    bool check_decodes_before_serving = true;  // GpuTierOptions::check_decodes_before_serving
    uint64_t decode_scratch_bytes = 0;         // GpuTierOptions::decode_scratch_bytes
    bool copy_while_reading = false;           // GpuTierOptions::copy_while_reading
  };
  StagingLoader(const TierParts& tier, const Own& own);
  StagingLoader(const StagingLoader&) = delete;
  StagingLoader& operator=(const StagingLoader&) = delete;

  // ---- REQUIRES: the tier's lock, for all of these.
  // Creates and lists a loading object for `key` (a stored object of this tier, or a weight) and
  // starts its host fetch. NOT_FOUND, INVALID_ARGUMENT (the catalog's), RESOURCE_EXHAUSTED (larger
  // than a slab).
  absl::StatusOr<StagingObject*> StartLoad(const std::string& key, ReadPriority priority,
                                           absl::Time deadline, Deferred& deferred);
  // A demand fetch joined a load that is not one yet: asks the host tier again, on the demand path;
  // whichever answer comes first is used.
  void Promote(StagingObject* object, absl::Time deadline, Deferred& deferred);
  // Leases resident `object` to `client` (through the host handoff buffer when asked). The
  // client's quota's RESOURCE_EXHAUSTED, the event pool's and the handoff buffer's errors.
  absl::StatusOr<LeaseGrant> Grant(GpuClient& client, StagingObject* object, bool through_host);
  // Ends a load that failed: frees what it held, unlists it and answers its waiters with
  // `status`.
  void FailLoad(StagingObject* object, const absl::Status& status, Deferred& deferred);
  // Answers the object's waiters: leases (or `status` when it is an error), pins.
  void AnswerWaiters(StagingObject* object, const absl::Status& status, Deferred& deferred);
  // Host fetches asked and not answered yet.
  uint64_t host_fetches_in_flight() const;

  // A copy into the object's range finished; `bytes_moved` is the stage it counts towards.
  // REQUIRES: the tier's lock is not held.
  void FinishCopyIn(StagingObject* object, uint64_t GpuTierStats::*bytes_moved)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void IssueHostFetch(StagingObject* object, ReadPriority priority, absl::Time deadline,
                      Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first part of `object` landed in the host tier: takes staging for `copies` from free room
  // (or the object's preferred placement), or discards them when there is none.
  void StartLandedCopies(StagingObject* object, LandedCopies& copies) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the object's landed copies, if any: the parts copied (none with `discard`).
  LandedCopies::Parts CloseLandedCopies(StagingObject* object, bool discard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnHostObject(StagingObject* object, absl::StatusOr<HostBytes> host) ABSL_LOCKS_EXCLUDED(mu_);
  // Copies `host` into the object's staging range and answers its waiters.
  void CopyIn(StagingObject* object, HostBytes host, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CopyIn of compressed host bytes: copied compressed, decoded into the object's range, readable
  // once FinishDecodeIn has the decode's verdict.
  void CopyInCompressed(StagingObject* object, std::shared_ptr<HostBytes> host, Stream& stream,
                        Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishDecodeIn(StagingObject* object, uint32_t verdict, const std::string& host_key,
                      uint64_t compressed_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a load whose copy could not be enqueued on `stream` (what was enqueued still runs).
  void FailCopyIn(StagingObject* object, Stream& stream, const absl::Status& status,
                  Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The host key the object's bytes come from.
  std::string HostKeyOf(const StagingObject* object) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex& mu_;
  Device& device_;
  const Catalog& catalog_;
  HostSource& host_source_;
  StagingPool& pool_;
  EventPool& events_;
  Stream& demand_stream_;
  Stream& prefetch_stream_;
  ChunkedCopier& copier_;
  StagingResidency& residency_;
  ClientTable& clients_;
  HandoffCopies& handoff_;
  const StoredKeySpace& stored_;
  RunningCallbacks& callbacks_;
  GpuTierStats& stats_ ABSL_GUARDED_BY(mu_);
  CompressedCopies compressed_;
  const bool check_decodes_before_serving_;
  uint64_t host_fetches_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // With copy_while_reading (null without: objects are copied once read), one thread that
  // enqueues the copies of the parts that landed, in the order they were told. Last, so destroyed first: what it still holds runs before the rest goes
  // (LandedCopies closed by then enqueue nothing).
  std::unique_ptr<WorkerPool> landed_enqueuer_;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_STAGING_LOADER_H_
