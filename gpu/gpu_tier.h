// The GPU tier: objects in daemon-owned staging memory, the leases clients hold on them, and the
// copies that move bytes between the host cache and staging.
//
// What it guarantees (the lease protocol, ../proto/tierd/v1/tierd.proto):
//  - A fetch is answered once the host → staging copy is enqueued; while the copy may run, the
//    lease names its ready event (one per copy, shared by the leases granted meanwhile). Demand
//    fetches use the high-priority copy stream and overtake prefetches.
//  - Clients fetching one key share one GPU copy. A leased, pinned or copying object never moves
//    and is never evicted; the rest are evicted least recently used first.
//  - Release waits, on the client's own drain stream, for the done event the client names (one of
//    the few each client is given): the buffer is reused only after the client's last read has
//    finished. No event is held per lease or reservation; an event slot is handed out again only
//    when nobody can wait on it any more. When the pool has none free, a copy is answered once it
//    completes instead, and a client gets fewer done events (it then waits on its CPU).
//  - Store: a reservation is a staging range; commit makes the copy to the host tier wait for the
//    done event the client names, publishes the object on the GPU at once and answers when the
//    host tier has it.
//  - Leases, reservations and pins belong to a client (a session). Closing the client releases
//    them, waiting for its done events at most `close_grace`, then freeing regardless (the
//    client is gone: its GPU work died with it).
//  - When staging is full and nothing can be evicted the answer is RESOURCE_EXHAUSTED at once;
//    when copies or drains in flight will free enough, the request waits for them (no polling).
//
// Callbacks run on the caller's thread, a reader thread or the device's completion thread; they
// must not block. Thread-safe.
//
// GpuTier is the facade the server calls; each lifecycle is a part of its own (gpu/detail/):
//   ClientTable       clients: leases, reservations, pins and quotas, open to closed
//   DrainQueue        waits for clients' done and written events on their drain streams
//   StagingResidency  objects by key, LRU, eviction, allocation and its waiters
//   StagingLoader     host tier → staging loads, and the leases and pins that wait for them
//   PeerLoader        loads lent by peer daemons (FetchOptions::ask_peers)
//   HandoffCopies     copies into the host handoff buffer (FetchOptions::through_host)
//   CommitPipeline    the store path: reserve → commit → host tier → durable
//   ExplicitEviction  Evict and ForgetModel across the GPU and host tiers
//   StoredKeySpace    a client group's stored-key prefix and its committed stored objects
// and ChunkedCopier (gpu/chunked_copier.h) issues the copies. The parts other than StoredKeySpace
// share the tier's one lock: a staging object is listed by the residency, leased and pinned by
// clients, freed by drains and published by commits, and whether it may be evicted or freed
// depends on all of them at once.
#ifndef TIERD_GPU_GPU_TIER_H_
#define TIERD_GPU_GPU_TIER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/liveness.h"
#include "common/timer_thread.h"
#include "device/device.h"
#include "gpu/chunked_copier.h"
#include "gpu/detail/client_table.h"
#include "gpu/detail/commit_pipeline.h"
#include "gpu/detail/drain_queue.h"
#include "gpu/detail/explicit_eviction.h"
#include "gpu/detail/handoff_copies.h"
#include "gpu/detail/peer_loader.h"
#include "gpu/detail/running_callbacks.h"
#include "gpu/detail/staging_loader.h"
#include "gpu/detail/staging_residency.h"
#include "gpu/detail/stored_key_space.h"
#include "gpu/detail/tier_parts.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/gpu_tier_types.h"
#include "gpu/host_handoff_buffer.h"
#include "gpu/peer_source.h"
#include "gpu/retained_sets.h"
#include "gpu/staging_pool.h"
#include "storage/host/host_arena.h"
#include "storage/host/host_cache.h"
#include "storage/model/catalog.h"

namespace tierd {

class GpuTier {
 public:
  using LeaseCallback = GpuLeaseCallback;
  using ReserveCallback = GpuReserveCallback;
  using StatusCallback = GpuStatusCallback;

  // Allocates the staging pool and the copy streams. All references must outlive the tier.
  static absl::StatusOr<std::unique_ptr<GpuTier>> Create(Device& device, Catalog& catalog,
                                                         HostArena& arena, HostCache& host_cache,
                                                         const GpuTierOptions& options);
  // Frees what closed clients still hold and waits for copies in flight. REQUIRES: every client
  // is closed.
  ~GpuTier();
  GpuTier(const GpuTier&) = delete;
  GpuTier& operator=(const GpuTier&) = delete;

  // A client (a session) that can hold leases, reservations and pins, with up to
  // GpuTierOptions::done_events_per_client done events (fewer when the pool is short).
  absl::StatusOr<ClientId> OpenClient(const ClientLimits& limits) ABSL_LOCKS_EXCLUDED(mu_);
  // The client's done events (ids in events()); empty for an unknown client.
  std::vector<uint32_t> DoneEvents(ClientId client) const ABSL_LOCKS_EXCLUDED(mu_);
  // Releases everything the client holds (see the header comment) and says what that was. Unknown
  // ids are ignored (nothing freed).
  ClosedClient CloseClient(ClientId client) ABSL_LOCKS_EXCLUDED(mu_);

  // Brings `key` into staging and leases it to `client`. Errors: INVALID_ARGUMENT (malformed key),
  // NOT_FOUND, RESOURCE_EXHAUSTED (pool or the client's quota), FAILED_PRECONDITION (model files
  // changed), DATA_LOSS, UNAVAILABLE (client closed), the host tier's errors.
  //
  // With ask_peers, a key this tier knows nothing of is looked for at the peers; the first
  // that has it lends it, and this tier copies it into a staging range of its own on the handoff
  // stream: the copy waits on the peer's ready event, the lease's ready event follows the copy, and
  // the peer's lease is given back once the copy has completed. Nothing is kept: the range is freed
  // with the lease, and every fetch copies the peer's current version again.
  void Fetch(ClientId client, const std::string& key, ReadPriority priority, absl::Time deadline,
             LeaseCallback done, FetchOptions options = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands the lease's buffer back once `done_event` (one of the client's done events, recorded
  // after its last read) completes; without one, at once. NOT_FOUND for a lease the client never
  // had; FAILED_PRECONDITION for one already released; INVALID_ARGUMENT for an event that is not
  // the client's.
  absl::Status Release(ClientId client, uint64_t lease_id,
                       std::optional<uint32_t> done_event = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);

  // Starts bringing `key` to the GPU (or only to the host tier) without holding it. Returns
  // whether anything was started; the errors known at once (unknown key) are returned.
  absl::StatusOr<bool> Prefetch(const std::string& key, absl::Time deadline, bool host_only)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Reserves staging for a stored object. `key` is "NAMESPACE/NAME" where NAMESPACE is not a
  // registered model. Errors: INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE,
  // FAILED_PRECONDITION (durable, and the daemon has no durable store).
  void Reserve(ClientId client, const std::string& key, uint64_t length,
               std::vector<TensorPlacement> tensors, StorePolicy policy, ReserveCallback done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Lists a stored object recovered from the durable store at start (HostCache::AdoptDurable
  // lists its bytes).
  void AdoptStored(const std::string& key, uint64_t size, std::vector<TensorPlacement> tensors)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Publishes (or with `abort`, abandons) a reservation once `written_event` (one of the client's
  // done events, recorded after its last write; none: the writes are done) completes; `done` runs
  // once the object is in the host tier, and for a durable one once it is durable. Commits of a
  // key take effect in the order their copies finish. A commit that fails leaves the key's
  // previous version, in memory and on disk. FAILED_PRECONDITION for a reservation the client does
  // not have open; INVALID_ARGUMENT for an event that is not the client's; the durable store's
  // errors (RESOURCE_EXHAUSTED for a full disk).
  void Commit(ClientId client, uint64_t reservation_id, bool abort,
              std::optional<uint32_t> written_event, StatusCallback done) ABSL_LOCKS_EXCLUDED(mu_);

  // Keeps `key` on the GPU until the client unpins it or closes; `done` runs once it is there.
  void Pin(ClientId client, const std::string& key, StatusCallback done) ABSL_LOCKS_EXCLUDED(mu_);
  // FAILED_PRECONDITION when the client has not pinned `key`.
  absl::Status Unpin(ClientId client, const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops `key_or_prefix` (a prefix ends in '/') from `tier`. For one key: NOT_FOUND when it is
  // known nowhere, FAILED_PRECONDITION when it is leased, pinned or busy. Under a prefix such
  // objects are skipped and counted; `evicted` counts objects gone from every tier asked for.
  absl::StatusOr<EvictResult> Evict(const std::string& key_or_prefix, EvictTier tier)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Unlists every object of `model` (after DropModel) here and in the host cache: they are freed
  // once nobody holds them.
  void ForgetModel(const std::string& model) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets this tier's stored objects under `model`/ (a model registered just now under a name
  // that clients had stored objects in): from the GPU, the host cache and the durable store; a
  // holder keeps its bytes until it lets go. Keys in a model's namespace name its weights only
  // (a stored object found there is never served for them). Returns how many were forgotten.
  size_t ForgetStoredUnder(const std::string& model) ABSL_LOCKS_EXCLUDED(mu_);

  bool IsOnGpu(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // How the listed object `key` is used now; nullopt when staging does not list it.
  std::optional<GpuObjectUse> ObjectUse(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // The next load of `key` goes to `range` if all of it is free then (StagingPool::AllocateAt):
  // a woken retained set's objects come back at the device addresses they had.
  void PreferPlacement(const std::string& key, const StagingRange& range) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops that wish for `key`, if any: its load is over, or failed before it got room.
  void ForgetPreferredPlacement(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // The size of the object `key` names: a model's object or shard (the catalog's errors), or one
  // of this tier's stored objects (NOT_FOUND when it has none).
  absl::StatusOr<uint64_t> ObjectSize(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // This tier's committed stored objects whose keys start with `prefix`, in order.
  std::vector<std::string> StoredKeysUnder(const std::string& prefix) const {
    return stored_.KeysUnder(prefix);
  }
  // The sets retained on this tier's GPU beyond the sessions that use them.
  RetainedSets& retained() { return *retained_; }
  const RetainedSets& retained() const { return *retained_; }
  const std::string& stored_key_prefix() const { return options_.stored_key_prefix; }
  // The store durable objects go to; null when there is none.
  const DurableStore* durable_store() const { return options_.durable_store; }
  GpuTierStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  HandleList Handles() const;
  const StagingPool& pool() const { return *pool_; }
  // True once a dead client left a wait that may never complete on one of the tier's streams:
  // whatever synchronizes the whole device (freeing or unregistering memory, destroying it) could
  // then wait forever.
  bool device_may_never_idle() const ABSL_LOCKS_EXCLUDED(mu_);
  const EventPool& events() const { return events_; }
  EventPoolStats event_stats() const { return events_.stats(); }
  const HostHandoffBuffer& handoff_buffer() const { return *handoff_buffer_; }

 private:
  GpuTier(Device& device, Catalog& catalog, HostArena& arena, HostCache& host_cache,
          const GpuTierOptions& options, std::unique_ptr<StagingPool> pool,
          std::unique_ptr<Stream> demand_stream, std::unique_ptr<Stream> prefetch_stream,
          std::unique_ptr<Stream> store_stream, std::unique_ptr<Stream> handoff_stream);

  // residency_.FindListed(key), unless that is a stored object in a registered model's namespace,
  // which is forgotten instead (nullptr).
  StagingObject* ListedServable(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Has the catalog derive the layout of the shard `key` names, if it names one, before the lock
  // is taken: a wide tensor's shard takes tens of milliseconds to derive, and the catalog keeps
  // it, so the lookup made under the lock finds it ready (unless the catalog let it go since,
  // past its bound on kept layouts).
  void DeriveShardLayout(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Hands a released lease's buffer back once `done_event` (and the lease's own event, for a copy
  // through the host) completes.
  void DrainLeaseLocked(GpuClient& client, const GpuClient::Lease& lease,
                        std::optional<uint32_t> done_event, DrainQueue::Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What ends a lease once its drain is over (`forced`: the client's grace ran out).
  void LeaseDrained(const GpuClient::Lease& lease, bool forced) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees what a closed client still waits for, its close grace having run out.
  void ForceClose(ClientId client) ABSL_LOCKS_EXCLUDED(mu_);

  Device& device_;
  const Catalog& catalog_;
  const GpuTierOptions options_;
  // The host cache as a HostSource, used when options_.host_source is null.
  LocalHostSource local_host_source_;
  HostSource& host_source_;
  std::unique_ptr<StagingPool> pool_;  // left to the process's exit after abandoned waits
  // This tier's own: its handles go to its sessions only (a client group's never to another's).
  EventPool events_;
  std::unique_ptr<HostHandoffBuffer> handoff_buffer_;
  const std::unique_ptr<Stream> demand_stream_;    // H2D, high priority
  const std::unique_ptr<Stream> prefetch_stream_;  // H2D
  const std::unique_ptr<Stream> store_stream_;     // D2H
  // Copies from peers' memory, which wait on the peer daemon's events.
  const std::unique_ptr<Stream> handoff_stream_;
  // Drain callbacks run on client drain streams, which a forced close may leave waiting forever on
  // CUDA; they find the tier through this, and the tier clears it when it goes.
  const std::shared_ptr<Liveness> liveness_;
  ChunkedCopier copier_;
  StoredKeySpace stored_;  // its own lock

  // The tier's lock, shared by the parts below (see the header comment).
  mutable absl::Mutex mu_;
  GpuTierStats stats_ ABSL_GUARDED_BY(mu_);
  RunningCallbacks callbacks_;
  ClientTable clients_;
  StagingResidency residency_;
  // What the parts below share (the lock and the parts above), handed to each.
  const TierParts parts_;
  HandoffCopies handoff_;
  DrainQueue drains_;
  StagingLoader loader_;
  PeerLoader peer_loader_;
  CommitPipeline commits_;
  ExplicitEviction eviction_;
  // Close-grace callbacks and the device calls of drains (DrainQueue::Start). Last, so it goes
  // first: what is still pending runs while the rest is alive.
  TimerThread timer_;
  // Made once the tier is built (it is one of the tier's clients); reset first by the destructor,
  // which needs every client closed.
  std::unique_ptr<RetainedSets> retained_;
};

}  // namespace tierd

#endif  // TIERD_GPU_GPU_TIER_H_
