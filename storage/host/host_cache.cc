// HostCache: fetches, eviction, pins and the residency table's questions. Reads from below and
// their checks are in host_cache_read.cc; stored objects (reservations, commits, spills, durable
// copies) in host_cache_stored.cc.
#include "storage/host/host_cache.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/deferred_calls.h"
#include "common/log.h"
#include "common/machine.h"
#include "device/pinned_host_buffer.h"
#include "storage/host/detail/host_cache_record.h"
#include "storage/io/read_router.h"

namespace tierd {

namespace {

using Kind = HostCacheRecord::Kind;
using State = HostCacheRecord::State;

}  // namespace

std::optional<EvictionPolicy> ParseEvictionPolicy(absl::string_view name) {
  if (name == "fifo") return EvictionPolicy::kFifo;
  if (name == "lru") return EvictionPolicy::kLru;
  return std::nullopt;
}

int DefaultChecksumThreads() { return std::clamp(UsableCpus() / 2, 1, 8); }

HostCache::HostCache(Catalog& catalog, DiskReader& reader, HostArena& arena, SpillWriter* spill,
                     const HostCacheOptions& options, RemoteReader* remote)
    : catalog_(catalog),
      disk_(reader),
      remote_(remote),
      reader_(std::make_unique<ReadRouter>(reader, remote)),
      arena_(arena),
      spill_(spill),
      options_(options),
      table_(*this, options.policy),
      checksums_(options.checksum_threads > 0 ? options.checksum_threads
                                              : DefaultChecksumThreads()),
      compressor_(std::max(options.compress_threads, 1)) {
  // Room that pinning adds serves allocations waiting for it.
  arena_.SetPinListener([this] {
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    table_.RetryWaiters(deferred.calls());
  });
}

HostCache::~HostCache() {
  arena_.SetPinListener(nullptr);
  {
    // Answered after the lock, while the cache is still whole: these callbacks take the lock.
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    // Every pending allocation is either waiting in the table or about to be answered.
    // A read can finish, and its callback tell the owner all is done, before the thread that
    // submitted it is back from the reader: that thread still needs the cache.
    compressing_ = false;  // queued compressions return at once; those running finish
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return reads_in_flight_ == 0 && submits_pending_ == 0 && spilling_bytes_ == 0 &&
             allocations_pending_ == table_.waiting() && compressions_in_flight_ == 0;
    };
    mu_.Await(absl::Condition(&settled));
    table_.FailWaiters(absl::UnavailableError("host cache shutting down"), deferred.calls());
  }
  // The table frees the memory; spill files go here.
  absl::MutexLock lock(&mu_);
  for (const auto& [key, entry] : table_.listed()) {
    if (!entry->spill_path.empty() && !entry->durable_copy) spill_->Remove(entry->spill_path);
  }
}

// ---- The residency table's questions ------------------------------------------------------------

bool HostCache::InFlight(const Entry& entry) const { return entry.busy(); }

bool HostCache::CanEvict(const Entry& entry) const {
  return entry.state == State::kResident &&
         (entry.kind == Kind::kWeight || !entry.spill_path.empty());
}

void HostCache::Evict(Entry& victim) {
  ++stats_.evictions;
  TIERD_VLOG(2) << "evicting " << victim.key() << " (" << FormatByteSize(victim.size) << ")";
  DropResidentLocked(&victim);
}

void HostCache::Destroying(Entry& entry) {
  if (entry.spill_path.empty()) return;
  disk_.ForgetFile(entry.spill_path);
  if (!entry.durable_copy) spill_->Remove(entry.spill_path);
}

std::optional<ArenaAllocation> HostCache::AllocateFree(uint64_t bytes) {
  return arena_.Allocate(bytes);
}

bool HostCache::WorthEvicting(uint64_t bytes, uint64_t evictable_bytes) {
  // While pinning still adds memory that will fit it, wait for that rather than evict.
  if (arena_.pinning() && arena_.capacity() - arena_.used_bytes() >= bytes) return false;
  // A request larger than everything free and evictable together must not empty the cache for
  // nothing.
  return arena_.pinned_bytes() - arena_.used_bytes() + evictable_bytes >= bytes;
}

bool HostCache::RoomComing(uint64_t bytes) {
  // Spills under way, pinning still adding memory, or device copies about to give back the
  // objects they read, may make room.
  return SpillForLocked(bytes) || arena_.pinning() ||
         refs_held_by_copies_.load(std::memory_order_relaxed) > 0;
}

absl::Status HostCache::NoRoom(uint64_t bytes, bool after_waiting) {
  if (after_waiting) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host cache full: nothing more can be evicted or spilled to fit ", FormatByteSize(bytes)));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("host cache full: ", FormatByteSize(arena_.used_bytes()), " of ",
                   FormatByteSize(arena_.pinned_bytes()),
                   " held by objects that are in use, pinned, in flight "
                   "or cannot spill; ",
                   FormatByteSize(bytes), " needed"));
}

// ---- Fetch --------------------------------------------------------------------------------------

HostObject HostCache::RefLocked(Entry* entry) {
  ++entry->refs;
  return HostObject(this, entry);
}

void HostCache::Fetch(const std::string& key, ReadPriority priority, absl::Time deadline,
                      FetchCallback done, LandedCallback landed) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto fail = [&](const absl::Status& status) {
    DeferAnswer(deferred.calls(), std::move(done), status);
  };
  if (!serving_) return fail(NotServing());
  Entry* entry = FindServableLocked(key);
  if (entry == nullptr) {
    absl::StatusOr<ObjectRef> object = catalog_.Lookup(key);
    if (!object.ok()) return fail(object.status());
    entry = table_.Create(key);
    entry->kind = Kind::kWeight;
    entry->state = State::kSpilled;  // i.e. not in memory: read it below
    entry->size = object->object->size;
    const std::vector<Extent>& extents = object->object->extents;
    if (extents.size() == 1 && extents[0].object_offset == 0) {
      entry->head = extents[0].file_offset % PageSize();
    }
    entry->source = *std::move(object);
    table_.Publish(entry);
  }
  switch (entry->state) {
    case State::kResident: {
      ++stats_.hits;
      table_.Touch(entry);
      DeferAnswer(deferred.calls(), std::move(done), RefLocked(entry));
      return;
    }
    case State::kAllocating:
    case State::kLoading:
      entry->waiters.push_back(std::move(done));
      ListenLocked(entry, std::move(landed));
      if (priority == ReadPriority::kDemand && !entry->demand) {
        entry->demand = true;
        if (entry->read_id) reader_->Reprioritize(*entry->read_id, priority, deadline);
      }
      return;
    case State::kWriting:
      return fail(absl::InternalError("a reservation is never listed"));
    case State::kSpilled:
      break;
  }
  ++stats_.misses;
  entry->state = State::kAllocating;
  entry->waiters.push_back(std::move(done));
  ListenLocked(entry, std::move(landed));
  entry->demand = priority == ReadPriority::kDemand;
  ++allocations_pending_;
  AllocateLocked(
      entry->head + entry->size,
      [this, entry, priority, deadline](absl::StatusOr<ArenaAllocation> memory) {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        --allocations_pending_;
        if (!memory.ok()) return FailLoadLocked(entry, memory.status(), later.calls());
        entry->memory = *std::move(memory);
        StartReadLocked(entry, TargetsLocked(entry),
                        entry->demand ? ReadPriority::kDemand : priority, deadline);
      },
      deferred.calls());
}

absl::Status HostCache::NotServing() {
  return absl::UnavailableError("the host cache is shutting down");
}

void HostCache::StopServing() {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  serving_ = false;
  table_.FailWaiters(NotServing(), deferred.calls());
}

HostCache::Entry* HostCache::FindServableLocked(const std::string& key) {
  Entry* entry = table_.Find(key);
  if (entry == nullptr) return nullptr;
  if (entry->kind == Kind::kWeight && !catalog_.IsCurrent(entry->source->model)) {
    // Bytes of a model that was dropped, registered again or changed on disk are never served.
    RemoveLocked(entry);
    return nullptr;
  }
  if (entry->kind == Kind::kStored && catalog_.InModelNamespace(key)) {
    // A stored object under a model's name (stored before the model was registered) is never
    // served as that model's weights: it goes, and the key is read from the model's files.
    TIERD_LOG_EVERY_N_SEC(WARNING, 10)
        << "dropping stored object " << key << ": its namespace is a registered model's";
    RemoveLocked(entry);
    return nullptr;
  }
  return entry;
}

absl::Status HostCache::Prefetch(const std::string& key, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (!serving_) return NotServing();
    if (FindServableLocked(key) == nullptr) {
      absl::StatusOr<ObjectRef> object = catalog_.Lookup(key);
      if (!object.ok()) return object.status();
    }
  }
  Fetch(key, ReadPriority::kPrefetch, deadline, [this, key](absl::StatusOr<HostObject> object) {
    if (!object.ok()) LogPrefetchFailure(key, object.status());
  });
  return absl::OkStatus();
}

void HostCache::LogPrefetchFailure(const std::string& key, const absl::Status& status) {
  if (status.code() == absl::StatusCode::kCancelled) return;
  TIERD_VLOG(1) << "prefetch of " << key << " failed: " << status;
}

bool HostCache::CancelPrefetch(const std::string& key) {
  ReadRouter::RequestId id;
  {
    absl::MutexLock lock(&mu_);
    const Entry* entry = table_.Find(key);
    if (entry == nullptr) return false;
    if (entry->state != State::kLoading || !entry->read_id || entry->demand) return false;
    id = *entry->read_id;
  }
  // Outside the lock: a successful cancel has FinishRead run (on the checksum pool).
  return reader_->Cancel(id);
}

void HostCache::Release(Entry* entry, bool held_by_copy) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  const bool last_copy_hold =
      held_by_copy && refs_held_by_copies_.fetch_sub(1, std::memory_order_relaxed) == 1;
  --entry->refs;
  if (entry->refs > 0) {
    // No more room is on its way from copies: a request waiting for one is answered now.
    if (last_copy_hold) table_.RetryWaiters(deferred.calls());
    return;
  }
  // A reservation dropped without commit, or an entry replaced or deleted meanwhile, goes now.
  table_.FreeIfUnused(entry);
  // The entry may have become evictable, or memory was freed: let waiting allocations retry.
  table_.RetryWaiters(deferred.calls());
}

void HostCache::DropResidentLocked(Entry* entry) {
  table_.Drop(entry);
  entry->state = State::kSpilled;
  // Weights are read again from their model; forget the entry.
  if (entry->kind == Kind::kWeight) RemoveLocked(entry);
}

void HostCache::AllocateLocked(uint64_t bytes, AllocationCallback done, Deferred& deferred) {
  bytes = std::max<uint64_t>(bytes, 1);
  if (bytes > arena_.capacity()) {
    return DeferAnswer(
        deferred, std::move(done),
        absl::StatusOr<ArenaAllocation>(absl::ResourceExhaustedError(
            absl::StrCat("an object of ", FormatByteSize(bytes),
                         " does not fit in a host cache of ", FormatByteSize(arena_.capacity())))));
  }
  table_.Allocate(bytes, std::move(done), deferred);
}

void HostCache::RemoveLocked(Entry* entry) {
  entry->pins = 0;  // pins belong to the key
  table_.Remove(entry);
}

absl::Status HostCache::Pin(const std::string& key) {
  absl::MutexLock lock(&mu_);
  Entry* entry = table_.Find(key);
  if (entry == nullptr || entry->state != State::kResident) {
    return absl::NotFoundError(absl::StrCat(key, " is not resident in the host cache"));
  }
  ++entry->pins;
  return absl::OkStatus();
}

absl::Status HostCache::Unpin(const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Entry* entry = table_.Find(key);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat(key, " is not cached"));
  if (entry->pins == 0) {
    return absl::FailedPreconditionError(absl::StrCat(key, " is not pinned"));
  }
  if (--entry->pins == 0) table_.RetryWaiters(deferred.calls());
  return absl::OkStatus();
}

absl::Status HostCache::Evict(const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Entry* entry = table_.Find(key);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat(key, " is not cached"));
  if (entry->state == State::kSpilled && !entry->busy()) return absl::OkStatus();
  if (entry->refs > 0 || entry->pins > 0 || entry->busy()) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, " is in use, pinned or in flight and cannot be evicted"));
  }
  if (table_.IsEvictable(*entry)) {
    ++stats_.evictions;
    DropResidentLocked(entry);
  } else if (entry->spillable && entry->MaySpillAgain()) {
    StartSpillLocked(entry);
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        key, " is a stored object that may not spill; evicting it would lose it (delete it)"));
  }
  table_.RetryWaiters(deferred.calls());
  return absl::OkStatus();
}

absl::Status HostCache::Discard(const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Entry* entry = table_.Find(key);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat(key, " is not cached"));
  if (entry->kind != Kind::kWeight || entry->busy()) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, " is a stored object or still being read, and is not discarded"));
  }
  ++stats_.evictions;
  RemoveLocked(entry);
  table_.RetryWaiters(deferred.calls());
  return absl::OkStatus();
}

std::vector<std::string> HostCache::Keys(absl::string_view prefix) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  const auto& listed = table_.listed();
  for (auto it = listed.lower_bound(prefix);
       it != listed.end() && absl::StartsWith(it->first, prefix); ++it) {
    keys.push_back(it->first);
  }
  return keys;
}

bool HostCache::IsResident(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  const Entry* entry = table_.Find(key);
  return entry != nullptr && entry->state == State::kResident;
}

uint64_t HostCache::ResidentBytes(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  const Entry* entry = table_.Find(key);
  return entry != nullptr && entry->state == State::kResident ? StoredBytes(*entry) : 0;
}

HostCacheStats HostCache::stats() const {
  // Outside mu_: the readers' locks.
  const uint64_t disk_bytes_read = disk_.stats().bytes_read;
  const RemoteReaderStats remote = remote_ != nullptr ? remote_->stats() : RemoteReaderStats{};
  absl::MutexLock lock(&mu_);
  HostCacheStats stats = stats_;
  stats.disk_bytes_read = disk_bytes_read;
  stats.remote_bytes_read = remote.bytes_fetched;
  stats.remote_cache_bytes_read = remote.bytes_from_cache;
  stats.capacity_bytes = arena_.capacity();
  stats.pinned_bytes = arena_.pinned_bytes();
  stats.used_bytes = arena_.used_bytes();
  stats.loading = reads_in_flight_;
  stats.checksums_while_reading = checksums_while_reading_.load(std::memory_order_relaxed);
  for (const auto& [key, entry] : table_.listed()) {
    if (entry->state == State::kResident) ++stats.objects;
    if (entry->state == State::kResident && entry->compressed) {
      ++stats.compressed_objects;
      stats.compressed_bytes += entry->compressed->encoded_bytes;
      stats.compressed_raw_bytes += entry->size;
    }
    if (entry->kind == Kind::kStored) {
      ++stats.stored_objects;
      if (entry->state == State::kSpilled) ++stats.spilled_objects;
    }
  }
  return stats;
}

}  // namespace tierd
