// The GPU tier: objects in daemon-owned staging memory, the leases clients hold on them, and the
// copies that move bytes between the host cache and staging.
//
// What it guarantees (the lease protocol, ../proto/tierd/v1/tierd.proto):
//  - A fetch is answered once the host → staging copy is enqueued; the lease names the copy's
//    ready event. Demand fetches use the high-priority copy stream and overtake prefetches.
//  - Clients fetching one key share one GPU copy. A leased, pinned or copying object never moves
//    and is never evicted; the rest are evicted least recently used first.
//  - Release waits, on the client's own drain stream, for the lease's done event: the buffer is
//    reused only after the client's last read has finished. An event slot is handed out again only
//    when nobody can wait on it any more.
//  - Store: a reservation is a staging range plus a written event; commit makes the copy to the
//    host tier wait for that event, publishes the object on the GPU at once and answers when the
//    host tier has it.
//  - Leases, reservations and pins belong to a client (a session). Closing the client releases
//    them, waiting for their done events at most `close_grace`, then freeing regardless (the
//    client is gone: its GPU work died with it).
//  - When staging is full and nothing can be evicted the answer is RESOURCE_EXHAUSTED at once;
//    when copies or drains in flight will free enough, the request waits for them (no polling).
//
// Callbacks run on the caller's thread, a reader thread or the device's completion thread; they
// must not block. Thread-safe.
#ifndef TIERD_GPU_GPU_TIER_H_
#define TIERD_GPU_GPU_TIER_H_

#include <cstdint>
#include <deque>
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
#include "absl/time/time.h"
#include "common/deferred_calls.h"
#include "common/timer_thread.h"
#include "device/device.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/host_handoff_buffer.h"
#include "gpu/peer_source.h"
#include "gpu/staging_pool.h"
#include "storage/catalog.h"
#include "storage/host_arena.h"
#include "storage/host_cache.h"

namespace tierd {

struct GpuTierOptions {
  uint64_t pool_bytes = 0;
  uint64_t slab_bytes = 2ull << 30;
  uint32_t max_events = 65536;
  // Host ↔ staging copies are issued in pieces of at most this, so a demand copy on the other
  // stream is not stuck behind one huge copy.
  uint64_t copy_chunk_bytes = 64ull << 20;
  absl::Duration close_grace = absl::Seconds(1);
  // Sessions open at once (each has a stream of its own); OpenClient refuses one more.
  uint32_t max_clients = 1024;
  // Where durable stored objects go; null: durable reservations are refused (FAILED_PRECONDITION).
  // Must outlive the tier.
  DurableStore* durable_store = nullptr;
  // Prefixed to the keys of this tier's stored objects in the host cache and the durable store,
  // which tiers share: a client group's tier (server/client_groups.h) keeps its
  // stored objects apart from every other tier's, and such a tier serves, prefetches and evicts
  // only its own stored objects and model weights. Empty for the daemon's default tier.
  std::string stored_key_prefix;
  // Where fetches of stored objects this tier does not have look next: the node's other daemons.
  // Null: nowhere (NOT_FOUND). Must outlive the tier.
  PeerSource* peers = nullptr;
  // The pinned host memory objects are copied through for peers that cannot read this GPU's
  // memory (FetchOptions::through_host); allocated on first use.
  uint64_t handoff_buffer_bytes = 256ull << 20;
};

// How a stored object is kept (ReserveRequest's flags).
struct StorePolicy {
  bool spillable = false;  // may go to the spill directory under host-memory pressure
  // Written and fsynced to the durable store before its commit is acknowledged; survives a restart
  // of the daemon. A durable object does not spill: its durable copy serves instead.
  bool durable = false;
};

struct ClientLimits {
  uint32_t max_leases = 4096;
  uint64_t max_staging_bytes = ~0ull;  // leased + reserved + pinned bytes
};

using ClientId = uint64_t;
using Tensors = std::shared_ptr<const std::vector<TensorPlacement>>;

struct LeaseGrant {
  uint64_t lease_id = 0;
  std::string key;
  StagingRange range;
  uint64_t length = 0;
  uint32_t ready_event = 0;
  uint32_t done_event = 0;
  Tensors tensors;
  // FetchOptions::through_host: where the bytes are in the host handoff buffer.
  std::optional<uint64_t> host_offset;
};

struct ReservationGrant {
  uint64_t reservation_id = 0;
  std::string key;
  StagingRange range;
  uint64_t length = 0;
  uint32_t written_event = 0;
};

enum class EvictTier { kGpu, kHost, kAll };

struct EvictResult {
  uint32_t evicted = 0;
  uint32_t skipped = 0;
};


// How a fetch is answered (FetchRequest's flags).
struct FetchOptions {
  // Where a key this tier (and the host tier and disk behind it) does not know is looked for
  // next: GpuTierOptions::peers, or nowhere (NOT_FOUND).
  bool ask_peers = false;
  // Also copy the object into the host handoff buffer and answer with its range there; the
  // lease's ready event is then the done event, recorded by the tier after that copy. For a peer
  // daemon whose GPU cannot read this one's memory.
  bool through_host = false;
};

// What a client still held when it was closed.
struct ClosedClient {
  size_t leases = 0;
  size_t reservations = 0;
  size_t pins = 0;  // distinct keys pinned
};

struct HandleList {
  std::vector<StagingSlabInfo> slabs;
  std::vector<EventInfo> events;
};

class GpuTier {
 public:
  using LeaseCallback = absl::AnyInvocable<void(absl::StatusOr<LeaseGrant>) &&>;
  using ReserveCallback = absl::AnyInvocable<void(absl::StatusOr<ReservationGrant>) &&>;
  using StatusCallback = absl::AnyInvocable<void(absl::Status) &&>;

  // Allocates the staging pool and the copy streams. All references must outlive the tier.
  static absl::StatusOr<std::unique_ptr<GpuTier>> Create(Device& device, Catalog& catalog,
                                                         HostArena& arena, HostCache& host_cache,
                                                         const GpuTierOptions& options);
  // Frees what closed clients still hold and waits for copies in flight. REQUIRES: every client
  // is closed.
  ~GpuTier();
  GpuTier(const GpuTier&) = delete;
  GpuTier& operator=(const GpuTier&) = delete;

  // A client (a session) that can hold leases, reservations and pins.
  absl::StatusOr<ClientId> OpenClient(const ClientLimits& limits) ABSL_LOCKS_EXCLUDED(mu_);
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
  // Hands the lease's buffer back once its done event completes. NOT_FOUND for a lease the client
  // never had; FAILED_PRECONDITION for one already released.
  absl::Status Release(ClientId client, uint64_t lease_id) ABSL_LOCKS_EXCLUDED(mu_);

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
  // Publishes (or with `abort`, abandons) a reservation; `done` runs once the object is in the
  // host tier, and for a durable one once it is durable. Commits of a key take effect in the
  // order their copies finish. A commit that fails leaves the key's previous version, in memory
  // and on disk. FAILED_PRECONDITION for a reservation the client does not have open; the durable
  // store's errors (RESOURCE_EXHAUSTED for a full disk).
  void Commit(ClientId client, uint64_t reservation_id, bool abort, StatusCallback done)
      ABSL_LOCKS_EXCLUDED(mu_);

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

  bool IsOnGpu(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
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
  const HostHandoffBuffer& handoff_buffer() const { return *handoff_buffer_; }

 private:
  struct Object;
  struct Client;
  struct Drain;
  struct AllocationWaiter;
  struct Liveness;
  struct PendingCommit;
  // Calls collected under the lock and made after it is released.
  using Deferred = DeferredCalls::Calls;

  GpuTier(Device& device, Catalog& catalog, HostArena& arena, HostCache& host_cache,
          const GpuTierOptions& options, std::unique_ptr<StagingPool> pool,
          std::unique_ptr<Stream> demand_stream, std::unique_ptr<Stream> prefetch_stream,
          std::unique_ptr<Stream> store_stream, std::unique_ptr<Stream> handoff_stream);

  Client* FindClientLocked(ClientId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The host cache's (and the durable store's) key for this tier's `key`: stored objects carry
  // the tier's prefix, model weights are shared.
  std::string HostKey(const std::string& key, bool stored) const {
    return stored ? options_.stored_key_prefix + key : key;
  }
  // The host key of `key` when this tier may act on it in the host cache: its own stored objects,
  // model weights, and (in the default tier) whatever else the host cache holds under that key.
  // NOT_FOUND for another client group's objects.
  absl::StatusOr<std::string> OwnHostKey(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t OpenClientsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TooManyClients() const;
  // The listed object for `key`, unless it is a weight of an older registration (then it is
  // unlisted and nullptr returned).
  Object* FindListedLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates and lists a loading object for `key` and starts its host fetch.
  absl::StatusOr<Object*> StartLoadLocked(const std::string& key, ReadPriority priority,
                                          absl::Time deadline, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IssueHostFetchLocked(Object* object, ReadPriority priority, absl::Time deadline,
                            Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnHostObject(Object* object, absl::StatusOr<HostObject> host) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks a callback into the tier (a host or peer fetch answered, a host reservation, a copy
  // done) as running, from before it counts itself out of its in-flight count until after the
  // calls it deferred past the lock have run: those use the tier and its objects too, so the
  // destructor waits for callbacks_running_ as well. Declared before the callback's DeferredCalls.
  class RunningCallback {
   public:
    explicit RunningCallback(GpuTier* tier) ABSL_LOCKS_EXCLUDED(tier->mu_) : tier_(tier) {
      absl::MutexLock lock(&tier_->mu_);
      ++tier_->callbacks_running_;
    }
    ~RunningCallback() {
      absl::MutexLock lock(&tier_->mu_);
      --tier_->callbacks_running_;
    }
    RunningCallback(const RunningCallback&) = delete;
    RunningCallback& operator=(const RunningCallback&) = delete;

   private:
    GpuTier* const tier_;
  };
  // Copies `host` into the object's staging range and answers its waiters.
  void CopyInLocked(Object* object, HostObject host, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A copy into the object's range finished; `bytes_moved` is the stage it counts towards.
  void FinishCopyIn(Object* object, uint64_t GpuTierStats::*bytes_moved) ABSL_LOCKS_EXCLUDED(mu_);
  void FailLoadLocked(Object* object, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The handoff from a peer (gpu_tier_peer.cc): asks the peers for `key` on behalf of `client`
  // with an unlisted object; once a peer lends it, allocates staging and copies it in.
  void StartPeerLoadLocked(Client& client, const std::string& key, LeaseCallback done,
                           Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnPeerCopy(Object* object, absl::StatusOr<PeerCopy> copy) ABSL_LOCKS_EXCLUDED(mu_);
  void CopyFromPeerLocked(Object* object, std::shared_ptr<PeerCopy> copy, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<LeaseGrant> GrantLocked(Client& client, Object* object, bool through_host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies a lease's object into the host handoff buffer after its ready event and records the
  // lease's done event after that copy (gpu_tier_peer.cc).
  absl::Status CopyToHandoffBufferLocked(Object* object, uint64_t host_offset, uint32_t done_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees a handoff buffer range once the handoff stream has run what is queued on it.
  void FreeHandoffRangeLater(uint64_t offset, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AnswerWaitersLocked(Object* object, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A staging range of `bytes`, evicting LRU objects as needed; nullopt when that is not enough.
  std::optional<StagingRange> TryAllocateLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocates now, once copies or drains in flight free room, or fails RESOURCE_EXHAUSTED.
  void AllocateLocked(uint64_t bytes,
                      absl::AnyInvocable<void(absl::StatusOr<StagingRange>) &&> done,
                      Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetryAllocationsLocked(Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PoolExhaustedLocked(uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Drops one of the client's pins of `key`. REQUIRES: the client has pinned it.
  void UnpinLocked(Client& client, const std::string& key, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsEvictableLocked(const Object* object) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(Object* object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnlistLocked(Object* object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeObjectLocked(Object* object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees an unlisted object that nothing uses any more.
  void DeleteIfUnusedLocked(Object* object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Completes `drain` once `event`'s current record, on the client's drain stream, has completed
  // (or the client's close grace ran out: then `forced`).
  void StartDrainLocked(Client& client, Drain drain, uint32_t event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishDrain(uint64_t drain_id) ABSL_LOCKS_EXCLUDED(mu_);
  // After a copy failed part-way, pieces of it may still be queued on `stream`: `range` and
  // `event` are freed once the stream has run them. Where the device cannot even arrange that,
  // they are retired for good (the pool is that much smaller) rather than risk handing them out
  // while the device still uses them. `what` and `error` are for the log.
  void FreeAfterStreamLocked(Stream& stream, StagingRange range, std::optional<uint32_t> event,
                             const std::string& what, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeAfterFailedCopy(StagingRange range, std::optional<uint32_t> event)
      ABSL_LOCKS_EXCLUDED(mu_);
  void FinishDrainLocked(uint64_t drain_id, bool forced, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForceClose(ClientId client) ABSL_LOCKS_EXCLUDED(mu_);

  // Commit steps: the host tier reserved room; the client's written event completed; both done:
  // copy out of staging; the copy finished.
  void OnHostReservation(uint64_t commit_id, absl::StatusOr<HostObject> host)
      ABSL_LOCKS_EXCLUDED(mu_);
  void WrittenLocked(uint64_t commit_id, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartCopyOutLocked(uint64_t commit_id, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy to the host tier is done: makes the object durable when asked, then publishes it.
  void FinishCopyOut(uint64_t commit_id, Object* object) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a commit whose copy is done: `status` says whether the object was published.
  void FinishCommit(uint64_t commit_id, Object* object, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void FailCommitLocked(uint64_t commit_id, absl::Status status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Copies in pieces of at most copy_chunk_bytes, for ranges outside the host arena.
  absl::Status CopyInPieces(Stream& stream, uint8_t* dst, const uint8_t* src, uint64_t bytes);
  // Copies in pieces of at most copy_chunk_bytes that never span two pinned pieces of the arena.
  absl::Status CopyChunked(Stream& stream, uint8_t* dst, const uint8_t* src, uint64_t bytes,
                           bool host_is_dst);

  Device& device_;
  Catalog& catalog_;
  HostArena& arena_;
  HostCache& host_cache_;
  const GpuTierOptions options_;
  std::unique_ptr<StagingPool> pool_;  // left to the process's exit after abandoned waits
  EventPool events_;
  std::unique_ptr<HostHandoffBuffer> handoff_buffer_;
  const std::unique_ptr<Stream> demand_stream_;    // H2D, high priority
  const std::unique_ptr<Stream> prefetch_stream_;  // H2D
  const std::unique_ptr<Stream> store_stream_;     // D2H
  // Copies from peers' memory, which wait on the peer daemon's events.
  const std::unique_ptr<Stream> handoff_stream_;
  std::shared_ptr<Liveness> liveness_;  // lets late drain callbacks find the tier gone

  mutable absl::Mutex mu_;
  std::map<std::string, Object*> objects_ ABSL_GUARDED_BY(mu_);  // listed, by key
  std::list<Object*> lru_ ABSL_GUARDED_BY(mu_);  // resident listed objects, least recent first
  std::map<ClientId, std::unique_ptr<Client>> clients_ ABSL_GUARDED_BY(mu_);
  ClientId next_client_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Drain> drains_ ABSL_GUARDED_BY(mu_);
  uint64_t next_drain_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<AllocationWaiter> allocation_waiters_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, PendingCommit> commits_ ABSL_GUARDED_BY(mu_);  // between request and host tier
  uint64_t next_commit_ ABSL_GUARDED_BY(mu_) = 1;
  // Size and tensor index of committed stored objects, by key: fetches need them after the GPU
  // copy is gone.
  struct StoredMeta {
    uint64_t size = 0;
    Tensors tensors;
  };
  std::map<std::string, StoredMeta> stored_ ABSL_GUARDED_BY(mu_);
  uint64_t copies_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Drains forced while their client's done event was still pending: the drain stream may wait
  // on it forever, and so would anything that synchronizes the whole device (freeing the pool).
  uint64_t abandoned_waits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t host_fetches_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peer_fetches_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // asked, not answered yet
  uint64_t host_reservations_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t callbacks_running_ ABSL_GUARDED_BY(mu_) = 0;  // see RunningCallback
  GpuTierStats stats_ ABSL_GUARDED_BY(mu_);
  // Close-grace callbacks and the device calls of drains (StartDrainLocked). Last, so it goes
  // first: what is still pending runs while the rest is alive.
  TimerThread timer_;
};

}  // namespace tierd

#endif  // TIERD_GPU_GPU_TIER_H_
