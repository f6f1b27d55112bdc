// The store path of the GPU tier: reserve a staging range and a written event for a client, then
// commit: once the client's written event completed (on its drain stream) and the host tier
// reserved room, the range is copied out on the store stream, the object is published on the GPU
// at once, and the commit is answered when the host tier has it (and, for a durable object, once
// the durable store has it). Commits of a key take effect in the order their copies finish; one
// that fails leaves the key's previous version, in memory and on disk.
//
// Internal to the GPU tier. Its state is guarded by the tier's lock (a commit publishes an object
// in the residency and is completed by a client drain).
#ifndef TIERD_GPU_DETAIL_COMMIT_PIPELINE_H_
#define TIERD_GPU_DETAIL_COMMIT_PIPELINE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/deferred_calls.h"
#include "device/device.h"
#include "gpu/chunked_copier.h"
#include "gpu/detail/client_table.h"
#include "gpu/detail/drain_queue.h"
#include "gpu/detail/running_callbacks.h"
#include "gpu/detail/staging_residency.h"
#include "gpu/detail/stored_key_space.h"
#include "gpu/detail/tier_parts.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/gpu_tier_types.h"
#include "gpu/staging_pool.h"
#include "storage/host/durable_store.h"
#include "storage/host/host_cache.h"
#include "storage/model/catalog.h"

namespace tierd {

class CommitPipeline {
 public:
  using Deferred = DeferredCalls::Calls;

  // What is its own beside the tier's shared parts; all must outlive it. The tier's lock guards
  // its state.
  struct Own {
    HostCache& host_cache;
    DurableStore* durable_store;  // null: durable reservations are refused
    Stream& store_stream;         // D2H
    ClientTable& clients;
    DrainQueue& drains;
    StoredKeySpace& stored;
  };
  CommitPipeline(const TierParts& tier, const Own& own);
  CommitPipeline(const CommitPipeline&) = delete;
  CommitPipeline& operator=(const CommitPipeline&) = delete;

  // As GpuTier::Reserve and GpuTier::Commit.
  void Reserve(ClientId client, const std::string& key, uint64_t length,
               std::vector<TensorPlacement> tensors, StorePolicy policy, GpuReserveCallback done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Commit(ClientId client, uint64_t reservation_id, bool abort,
              std::optional<uint32_t> written_event, GpuStatusCallback done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Frees an abandoned reservation's range: the client's stream may still be writing it until it
  // has run past the client's record of `written_event`, if any. REQUIRES: the tier's lock.
  void Abandon(GpuClient& client, GpuClient::Reservation reservation,
               std::optional<uint32_t> written_event, Deferred& deferred);
  // Frees a reservation nobody can write into any more. REQUIRES: the tier's lock.
  void Abandoned(GpuClient::Reservation reservation);
  // No commit is between its request and its answer. REQUIRES: the tier's lock.
  bool idle() const;

 private:
  // A commit between its request and the object reaching the host tier. Two things must happen
  // before the copy out of staging starts: the client's written event completes, and the host tier
  // reserves room.
  struct PendingCommit {
    GpuClient::Reservation reservation;
    GpuStatusCallback done;
    bool written = false;
    std::shared_ptr<HostObject> host;  // set once reserved
    absl::Status host_status;          // the host tier's refusal
  };

  // Commit steps: the host tier reserved room; the client's written event completed; both done:
  // copy out of staging; the copy finished.
  void OnHostReservation(uint64_t commit_id, absl::StatusOr<HostObject> host)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Written(uint64_t commit_id, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartCopyOut(uint64_t commit_id, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy to the host tier is done: makes the object durable when asked, then publishes it.
  void FinishCopyOut(uint64_t commit_id, StagingObject* object) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a commit whose copy is done: `status` says whether the object was published.
  void FinishCommit(uint64_t commit_id, StagingObject* object, absl::Status status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void FailCommit(uint64_t commit_id, absl::Status status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex& mu_;
  Device& device_;
  const Catalog& catalog_;
  HostCache& host_cache_;
  DurableStore* const durable_store_;
  StagingPool& pool_;
  Stream& store_stream_;
  ChunkedCopier& copier_;
  StagingResidency& residency_;
  ClientTable& clients_;
  DrainQueue& drains_;
  StoredKeySpace& stored_;
  RunningCallbacks& callbacks_;
  GpuTierStats& stats_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, PendingCommit> commits_ ABSL_GUARDED_BY(mu_);  // between request and answer
  uint64_t next_commit_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t host_reservations_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_COMMIT_PIPELINE_H_
