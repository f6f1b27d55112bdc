// The host tier: objects held in the pinned arena.
//
// Two kinds of object live here:
//  - weight objects, described by the Catalog and read from their safetensors files by the
//    DiskReader. Every read is checksummed (xxHash3): the first read records the checksum in the
//    catalog, later reads verify it, and a mismatch is DATA_LOSS — the bytes are dropped, never
//    handed out;
//  - stored objects, written by clients (activation caches): reserved, filled, committed. Where
//    the client allows it, a stored object is spilled to the spill directory when room is needed
//    (checksummed as it is written) and read back, verified, on the next fetch. A durable stored
//    object has a copy in the DurableStore (SetDurableCopy, or AdoptDurable after a restart): it
//    is evicted like a spilled one and read back from that copy. The cache never removes a
//    durable copy; the DurableStore does.
//
// Eviction is FIFO by default (LRU selectable) over objects that can be had again (weights, and
// stored objects with a spilled copy). Objects that are referenced (a HostObject exists), pinned,
// being read, written or spilled are never evicted. When room is needed and none can be made, the
// answer is RESOURCE_EXHAUSTED at once; when room is being made by spills in flight, the request
// waits for them (no busy loop: it is retried when memory is freed).
//
// Callbacks run on the caller's thread when the answer is immediate; otherwise on a checksum,
// reader or spill thread, or on the thread whose release, unpin, evict or delete made the room a
// waiting request needed. They must not block, and must not take locks their caller may hold while
// releasing a HostObject. Thread-safe.
#ifndef TIERD_STORAGE_HOST_HOST_CACHE_H_
#define TIERD_STORAGE_HOST_HOST_CACHE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/exponent_codec.h"
#include "common/deferred_calls.h"
#include "common/residency.h"
#include "common/worker_pool.h"
#include "storage/host/durable_store.h"
#include "storage/host/host_arena.h"
#include "storage/host/host_cache_stats.h"
#include "storage/io/disk_reader.h"
#include "storage/io/remote_reader.h"
#include "storage/io/spill_writer.h"
#include "storage/model/catalog.h"

namespace tierd {

// "fifo" / "lru" ↔ EvictionPolicy.
std::optional<EvictionPolicy> ParseEvictionPolicy(absl::string_view name);

struct HostCacheOptions {
  EvictionPolicy policy = EvictionPolicy::kFifo;
  // Threads that finish reads as they complete — check and answer them — so that the reader
  // threads go on reading meanwhile. A local file's object arrives mostly hashed (its reader
  // threads hash its chunks as they land; these hash what they left); the others' (an object
  // store's) are hashed here, in one pass. 0: DefaultChecksumThreads().
  int checksum_threads = 0;
  // Keep weight objects compressed once resident (codec/exponent_codec.h): a background thread
  // encodes each one after its read, off the read path, and swaps the compressed form in for the
  // raw one once no reference holds the object; until then the raw form is served. Objects that
  // would not gain stay raw, and so do models registered with compression off.
  bool compress_weights = false;
  // Threads that encode. Each holds one object's compressed form in ordinary memory meanwhile.
  int compress_threads = 1;
  codec::EncodingOptions encoding;
};

// Half the machine's cores, 1 to 8. xxHash3 over freshly read memory, in a pass after the read,
// ran at 4–5 GB/s per thread on a 16-core GPU host: 4 threads held a tmpfs model load to
// 15–17 GB/s, 8 let it reach 20 GB/s, the speed of 8 threads pread-ing the files. Threads with
// nothing to hash cost nothing.
int DefaultChecksumThreads();

class HostCache;
struct HostCacheRecord;  // storage/host/detail/host_cache_record.h
class ReadRouter;        // storage/io/read_router.h
using HostCacheTable = ResidencyTable<HostCacheRecord, ArenaAllocation>;

// A reference to an object resident in the host cache: while it lives, the object stays resident
// and its bytes do not change. A reservation from ReserveStore is a writable HostObject until it
// is committed. Move-only; releasing it is destroying it.
class HostObject {
 public:
  HostObject() = default;
  HostObject(HostObject&& other) noexcept { *this = std::move(other); }
  HostObject& operator=(HostObject&& other) noexcept;
  ~HostObject() { Reset(); }

  bool valid() const { return entry_ != nullptr; }
  const std::string& key() const;
  // The object's bytes: its raw bytes, or its compressed form when compressed() is set.
  uint8_t* data() const;
  // The object's size (raw, also when it is held compressed).
  uint64_t size() const;
  // The layout of the compressed form data() holds; nullptr when it holds the raw bytes. Fixed
  // for the reference's life.
  const codec::CompressedLayout* compressed() const;
  // The bytes at data(): size(), or the compressed form's size.
  uint64_t stored_size() const;
  void Reset();
  // Says the reference is now held by a device copy, which gives it back on its own once done
  // (whoever waits on the copy may run before that): until then a request for room fails not at
  // once, but waits for it.
  void HeldByCopy();

 private:
  using Entry = HostCacheTable::Entry;
  friend class HostCache;
  HostObject(HostCache* cache, Entry* entry) : cache_(cache), entry_(entry) {}

  HostCache* cache_ = nullptr;
  Entry* entry_ = nullptr;
  bool held_by_copy_ = false;
};

// Built on the residency core (common/residency.h): the table keeps the entries, their refs, pins,
// eviction order and the requests waiting for room; the cache is the table's owner and says what
// is in flight, what can be evicted, and where room comes from.
class HostCache : private HostCacheTable::Owner {
 public:
  using FetchCallback = absl::AnyInvocable<void(absl::StatusOr<HostObject>) &&>;
  // Told, while a fetched object is read, that [begin, end) of it has landed at `bytes` (its final
  // place in host memory) and will not change. The bytes are not checked yet: whoever uses them
  // early (the GPU tier copies them on) must serve nothing of them unless the fetch is answered
  // with the object; if it fails, they may have been wrong, and their memory may be reused once
  // the answer is given. Called on reader threads, several at once, in any order, each part once,
  // and never after the fetch's answer; must not block.
  using LandedCallback =
      absl::AnyInvocable<void(const uint8_t* bytes, uint64_t begin, uint64_t end) const>;

  // `spill` may be null: then stored objects never spill; `remote` may be null: then models
  // registered from object storage cannot be read. All must outlive the cache.
  HostCache(Catalog& catalog, DiskReader& reader, HostArena& arena, SpillWriter* spill,
            const HostCacheOptions& options, RemoteReader* remote = nullptr);
  // REQUIRES: no HostObject is alive. Waits for reads and spills in flight.
  ~HostCache() override;
  HostCache(const HostCache&) = delete;
  HostCache& operator=(const HostCache&) = delete;

  // Brings `key` into the host cache and calls `done` with a reference to it: at once when it is
  // resident, otherwise after reading it (weights from their files, stored objects from their
  // spill file) with `priority` and `deadline`. A key in a registered model's namespace is that
  // model's object only: a stored object found under it (stored before the model was registered)
  // is removed, never served. Errors: INVALID_ARGUMENT (malformed key),
  // NOT_FOUND, FAILED_PRECONDITION (model files changed), RESOURCE_EXHAUSTED (no room can be
  // made), DATA_LOSS (checksum mismatch, truncated file), CANCELLED (its prefetch was cancelled),
  // UNAVAILABLE (shutting down), and the errors of reading the files (PERMISSION_DENIED, ...).
  // `landed`, when given, is told of the object's parts as they land while this fetch waits for
  // its read (in checksum segments, as they are hashed through: a local file's; an object store's
  // reader tells nothing); parts that landed before the fetch came, a read that started with no
  // fetch asking (a fetch joining it is told nothing), and a resident object, are not told.
  void Fetch(const std::string& key, ReadPriority priority, absl::Time deadline, FetchCallback done,
             LandedCallback landed = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts bringing `key` in without holding it. The errors known at once (unknown key) are
  // returned; later ones are counted and logged.
  absl::Status Prefetch(const std::string& key, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the read of a prefetched object that has not started; true when it was cancelled.
  bool CancelPrefetch(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Reserves `bytes` for stored object `key` and calls `done` with the writable reservation.
  // `spillable`: the object may go to the spill directory under pressure. Errors:
  // INVALID_ARGUMENT (empty key, 0 bytes), RESOURCE_EXHAUSTED.
  void ReserveStore(const std::string& key, uint64_t bytes, bool spillable, FetchCallback done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Publishes a filled reservation under its key, replacing an older version (which lives on
  // until its references are gone). `reservation` stays a valid reference to the new object.
  // FAILED_PRECONDITION when it is not an uncommitted reservation, or when its key's namespace has
  // become a registered model's meanwhile (keys there name weights only: see Fetch).
  absl::Status CommitStore(HostObject& reservation) ABSL_LOCKS_EXCLUDED(mu_);

  // Records that `object` (a committed stored object) has the durable copy `record`: from now on it
  // can be evicted and read back from there. REQUIRES: it was reserved not spillable (a durable
  // object's copy on disk serves instead of a spill file).
  void SetDurableCopy(const HostObject& object, const DurableRecord& record)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Lists a durable object recovered at start, on disk only. ALREADY_EXISTS when the key is known.
  absl::Status AdoptDurable(const DurableRecord& record) ABSL_LOCKS_EXCLUDED(mu_);

  // Keeps a resident object from being evicted until Unpin. Pins count. NOT_FOUND when it is not
  // resident; Unpin: NOT_FOUND when unknown, FAILED_PRECONDITION when not pinned.
  absl::Status Pin(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Unpin(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops `key` from host memory: weights and spilled stored objects can be read again; a
  // spillable stored object is spilled first (asynchronously). FAILED_PRECONDITION for an object
  // that is referenced, pinned or busy, or a stored object that cannot spill (Delete it).
  absl::Status Evict(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets weight `key`, whose bytes were found wrong (a compressed form that does not decode to
  // its checksums): the next fetch reads it from its files again, while references keep the old
  // bytes until released; its pins go with it. NOT_FOUND when it is not cached;
  // FAILED_PRECONDITION for a stored object or one still being read.
  absl::Status Discard(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes a stored object entirely (memory and spill file); references keep their bytes until
  // released. NOT_FOUND when there is none.
  absl::Status Delete(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  // From now on nothing new is read or reserved: Fetch, Prefetch and ReserveStore answer
  // UNAVAILABLE, and requests waiting for room are refused so; reads in flight complete. Memory
  // freed after this is never written again, for the node's other daemons that may still copy
  // from it (server/node/host_lender.h). Idempotent.
  void StopServing() ABSL_LOCKS_EXCLUDED(mu_);

  bool IsResident(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes `key` takes in host memory while resident (HostObject::stored_size), else 0.
  uint64_t ResidentBytes(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Keys starting with `prefix` that the cache knows: resident, loading or spilled.
  std::vector<std::string> Keys(absl::string_view prefix) const ABSL_LOCKS_EXCLUDED(mu_);
  HostCacheStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class HostObject;
  using Entry = HostCacheTable::Entry;
  using AllocationCallback = HostCacheTable::AllocationCallback;
  // Calls collected under the lock and made after it is released.
  using Deferred = DeferredCalls::Calls;

  // HostCacheTable::Owner, called by the table with mu_ held.
  bool InFlight(const Entry& entry) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Weights, and stored objects with a spilled or durable copy, that are resident.
  bool CanEvict(const Entry& entry) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Evict(Entry& victim) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets and removes its spill file (a durable copy stays).
  void Destroying(Entry& entry) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<ArenaAllocation> AllocateFree(uint64_t bytes) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Not while pinning still adds memory that will fit it, nor when free and evictable memory
  // together are not enough.
  bool WorthEvicting(uint64_t bytes, uint64_t evictable_bytes) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Spills in flight (started here as needed) or pinning still adding memory.
  bool RoomComing(uint64_t bytes) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NoRoom(uint64_t bytes, bool after_waiting) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Drops a reference; `held_by_copy` when HeldByCopy said so.
  void Release(Entry* entry, bool held_by_copy) ABSL_LOCKS_EXCLUDED(mu_);
  void HoldForCopy() { refs_held_by_copies_.fetch_add(1, std::memory_order_relaxed); }
  HostObject RefLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the memory of a resident entry that can be had again (evictable); a weight entry is
  // removed, a stored one stays as spilled.
  void DropResidentLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocates now, or once spills free room, or fails with RESOURCE_EXHAUSTED; `done` is deferred.
  void AllocateLocked(uint64_t bytes, AllocationCallback done, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts spilling objects until `bytes` are on their way out; true when any spill is in flight.
  bool SpillForLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartSpillLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `checksum`: of the bytes written, when `status` is OK.
  void FinishSpill(Entry* entry, const std::string& path, const absl::Status& status,
                   uint64_t checksum) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `landed` to the listeners of `entry`'s load (allocating or loading), if given.
  void ListenLocked(Entry* entry, LandedCallback landed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts reading a weight or spilled object into `entry` (which has memory).
  void StartReadLocked(Entry* entry, std::vector<ReadTarget> targets, ReadPriority priority,
                       absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishRead(Entry* entry, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // Checks the bytes a read brought into the loading `entry` against the checksum recorded for
  // them (recording it on a weight's first read): OK or DATA_LOSS. Runs on the reader's thread
  // (ReadRequest::check) or in FinishRead, without the lock: nothing else touches a loading
  // entry's memory.
  absl::Status CheckLoadedBytes(Entry* entry) ABSL_LOCKS_EXCLUDED(mu_);
  void FailLoadLocked(Entry* entry, const absl::Status& status, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unlists `entry` (its pins belong to the key and go) and frees it once nothing uses it.
  void RemoveLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of `key` that may be served, or nullptr: a weight of a registration that is no
  // longer current, or a stored object in a registered model's namespace, is removed instead.
  Entry* FindServableLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::Status NotServing();
  // Where the reads that bring `entry` into its memory go.
  std::vector<ReadTarget> TargetsLocked(const Entry* entry) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogPrefetchFailure(const std::string& key, const absl::Status& status);

  // ---- Compression (host_cache_compress.cc) ----
  // Queues a weight that has just become resident for the compressor, when it may gain.
  void MaybeCompressLocked(Entry* entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The compressor's job for `key`: plans and encodes the raw bytes without the lock, then swaps
  // the compressed form in once nothing else references the object.
  void Compress(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Swaps `encoded` in for `entry`'s raw bytes. REQUIRES: the only reference is the caller's.
  void SwapInCompressedLocked(Entry* entry, const std::vector<uint8_t>& encoded,
                              const codec::CompressedLayout& layout, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Catalog& catalog_;
  DiskReader& disk_;                          // its descriptors and counters
  RemoteReader* const remote_;                // its counters; null without an object store
  const std::unique_ptr<ReadRouter> reader_;  // to the disk reader, or the remote one
  HostArena& arena_;
  SpillWriter* const spill_;
  const HostCacheOptions options_;

  mutable absl::Mutex mu_;
  // The objects by key, their eviction order and the allocations waiting for room.
  HostCacheTable table_ ABSL_GUARDED_BY(mu_);
  uint64_t spilling_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reads_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> checksums_while_reading_{0};  // HostCacheStats::checksums_while_reading
  // References device copies hold until they are done (HostObject::HeldByCopy). Atomic, not under
  // mu_: a copy is started under its tier's lock, which is never taken inside mu_'s.
  std::atomic<uint64_t> refs_held_by_copies_{0};
  uint64_t submits_pending_ ABSL_GUARDED_BY(mu_) = 0;  // threads inside StartReadLocked's window
  uint64_t allocations_pending_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_spill_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool serving_ ABSL_GUARDED_BY(mu_) = true;      // until StopServing
  bool compressing_ ABSL_GUARDED_BY(mu_) = true;  // until destruction: queued jobs then return
  uint64_t compressions_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  HostCacheStats stats_ ABSL_GUARDED_BY(mu_);
  // Runs FinishRead for every read. Joined before anything its jobs use.
  WorkerPool checksums_;
  // Runs Compress. Last: joined first.
  WorkerPool compressor_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_HOST_CACHE_H_
