#include "storage/host_cache.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "common/deferred_calls.h"
#include "common/log.h"
#include "device/pinned_host_buffer.h"
#include "storage/object_checksum.h"

namespace tierd {

struct HostObject::Entry {
  enum class Kind { kWeight, kStored };
  enum class State {
    kAllocating,  // waiting for memory
    kLoading,     // being read from disk
    kResident,
    kWriting,  // a reservation not committed yet
    kSpilled,  // on disk only
  };

  std::string key;
  Kind kind = Kind::kWeight;
  State state = State::kAllocating;
  std::optional<ArenaAllocation> memory;
  // The object's bytes start this far into `memory`: the file offset's position within its 4 KiB
  // block, so that a contiguous object's aligned superset fits the allocation and is read in place.
  uint64_t head = 0;
  uint64_t size = 0;
  int refs = 0;
  int pins = 0;
  bool listed = false;              // entries_[key] is this entry
  std::optional<ObjectRef> source;  // weights: where the bytes are in the model's files
  // Stored objects.
  bool spillable = false;
  bool spilling = false;  // a spill write is in flight; the memory stays valid meanwhile
  // When its last spill failed (a full disk): it is not tried again before kSpillRetryDelay.
  absl::Time spill_failed_at = absl::InfinitePast();
  std::string spill_path;     // set once a spilled (or durable) copy exists
  uint64_t spill_offset = 0;  // where the object's bytes start in spill_path
  bool durable_copy = false;  // spill_path belongs to the DurableStore: never removed here
  uint64_t checksum = 0;      // of a stored object, computed when it is spilled
  // Loading.
  std::vector<HostCache::FetchCallback> waiters;
  std::optional<DiskReader::RequestId> read_id;
  int submits_pending = 0;  // reads being submitted (the lock is dropped): the entry must stay
  uint64_t load = 0;        // numbers the loads, so a late submit knows whether it is current
  bool demand = false;      // some waiter is a demand fetch
  std::list<Entry*>::iterator position;  // in order_, while resident
  bool in_order = false;

  bool busy() const {
    return state == State::kAllocating || state == State::kLoading || spilling ||
           submits_pending > 0;
  }
};

namespace {

using Entry = HostObject::Entry;

// A failed spill (a full or failing disk) is not retried at once: room is then looked for
// elsewhere, or the request is refused, instead of spinning on the same failure.
constexpr absl::Duration kSpillRetryDelay = absl::Seconds(1);

bool MaySpillAgain(const Entry& entry) {
  return absl::Now() - entry.spill_failed_at >= kSpillRetryDelay;
}

bool LosesStoredObject(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss ||
         status.code() == absl::StatusCode::kNotFound;
}

}  // namespace

std::optional<EvictionPolicy> ParseEvictionPolicy(absl::string_view name) {
  if (name == "fifo") return EvictionPolicy::kFifo;
  if (name == "lru") return EvictionPolicy::kLru;
  return std::nullopt;
}

HostObject& HostObject::operator=(HostObject&& other) noexcept {
  if (this != &other) {
    Reset();
    cache_ = std::exchange(other.cache_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
  }
  return *this;
}

const std::string& HostObject::key() const { return entry_->key; }
uint8_t* HostObject::data() const { return cache_->arena_.data(*entry_->memory) + entry_->head; }
uint64_t HostObject::size() const { return entry_->size; }

void HostObject::Reset() {
  if (entry_ != nullptr) cache_->Release(entry_);
  cache_ = nullptr;
  entry_ = nullptr;
}

HostCache::HostCache(Catalog& catalog, DiskReader& reader, HostArena& arena, SpillWriter* spill,
                     const HostCacheOptions& options)
    : catalog_(catalog), reader_(reader), arena_(arena), spill_(spill), options_(options) {
  // Room that pinning adds serves allocations waiting for it.
  arena_.SetPinListener([this] {
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    RetryWaitersLocked(deferred.calls());
  });
}

HostCache::~HostCache() {
  arena_.SetPinListener(nullptr);
  std::deque<AllocationWaiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    // Every pending allocation is either parked in waiters_ or about to be answered.
    // A read can finish, and its callback tell the owner all is done, before the thread that
    // submitted it is back from the reader: that thread still needs the cache.
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return reads_in_flight_ == 0 && submits_pending_ == 0 && spilling_bytes_ == 0 &&
             allocations_pending_ == waiters_.size();
    };
    mu_.Await(absl::Condition(&settled));
    waiters.swap(waiters_);
  }
  // Answered while the cache is still whole: these callbacks take the lock.
  for (AllocationWaiter& waiter : waiters) {
    std::move(waiter.done)(absl::UnavailableError("host cache shutting down"));
  }
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : entries_) {
    if (entry->memory) arena_.Free(*entry->memory);
    if (!entry->spill_path.empty() && !entry->durable_copy) ::unlink(entry->spill_path.c_str());
    delete entry;
  }
}

HostObject HostCache::RefLocked(Entry* entry) {
  ++entry->refs;
  return HostObject(this, entry);
}

void HostCache::TouchLocked(Entry* entry) {
  if (options_.policy == EvictionPolicy::kLru && entry->in_order) {
    order_.splice(order_.end(), order_, entry->position);
  }
}

bool HostCache::IsEvictableLocked(const Entry* entry) const {
  return entry->state == Entry::State::kResident && entry->refs == 0 && entry->pins == 0 &&
         !entry->busy() && (entry->kind == Entry::Kind::kWeight || !entry->spill_path.empty());
}

void HostCache::Fetch(const std::string& key, ReadPriority priority, absl::Time deadline,
                      FetchCallback done) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto fail = [&](const absl::Status& status) {
    DeferAnswer(deferred.calls(), std::move(done), status);
  };
  Entry* entry = nullptr;
  if (auto it = entries_.find(key); it != entries_.end()) {
    entry = it->second;
    if (entry->kind == Entry::Kind::kWeight) {
      // Bytes of a model that was dropped, registered again or changed on disk are never served.
      if (!catalog_.IsCurrent(entry->source->model)) {
        RemoveLocked(entry);
        entry = nullptr;
      }
    }
  }
  if (entry == nullptr) {
    absl::StatusOr<ObjectRef> object = catalog_.Lookup(key);
    if (!object.ok()) return fail(object.status());
    entry = new Entry;
    entry->key = key;
    entry->kind = Entry::Kind::kWeight;
    entry->state = Entry::State::kSpilled;  // i.e. not in memory: read it below
    entry->size = object->object->size;
    const std::vector<Extent>& extents = object->object->extents;
    if (extents.size() == 1 && extents[0].object_offset == 0) {
      entry->head = extents[0].file_offset % PageSize();
    }
    entry->source = *std::move(object);
    entry->listed = true;
    entries_[key] = entry;
  }
  switch (entry->state) {
    case Entry::State::kResident: {
      ++stats_.hits;
      TouchLocked(entry);
      DeferAnswer(deferred.calls(), std::move(done), RefLocked(entry));
      return;
    }
    case Entry::State::kAllocating:
    case Entry::State::kLoading:
      entry->waiters.push_back(std::move(done));
      if (priority == ReadPriority::kDemand && !entry->demand) {
        entry->demand = true;
        if (entry->read_id) reader_.Reprioritize(*entry->read_id, priority, deadline);
      }
      return;
    case Entry::State::kWriting:
      return fail(absl::InternalError("a reservation is never listed"));
    case Entry::State::kSpilled:
      break;
  }
  ++stats_.misses;
  entry->state = Entry::State::kAllocating;
  entry->waiters.push_back(std::move(done));
  entry->demand = priority == ReadPriority::kDemand;
  ++allocations_pending_;
  AllocateLocked(
      entry->head + entry->size,
      [this, entry, priority, deadline](absl::StatusOr<ArenaAllocation> memory) {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        --allocations_pending_;
        if (!memory.ok()) return FailLoadLocked(entry, memory.status(), later.calls());
        entry->memory = *memory;
        StartReadLocked(entry, TargetsLocked(entry),
                        entry->demand ? ReadPriority::kDemand : priority, deadline);
      },
      deferred.calls());
}

absl::Status HostCache::Prefetch(const std::string& key, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (entries_.find(key) == entries_.end()) {
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
  DiskReader::RequestId id;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    Entry* entry = it->second;
    if (entry->state != Entry::State::kLoading || !entry->read_id || entry->demand) return false;
    id = *entry->read_id;
  }
  // Outside the lock: a successful cancel calls FinishRead at once.
  return reader_.Cancel(id);
}

void HostCache::StartReadLocked(Entry* entry, std::vector<ReadTarget> targets,
                                ReadPriority priority, absl::Time deadline) {
  entry->state = Entry::State::kLoading;
  ++entry->submits_pending;
  ++submits_pending_;
  const uint64_t load = ++entry->load;
  ++reads_in_flight_;
  // Submitted outside the lock: the reader may answer at once, which re-enters FinishRead — and
  // the load may even fail and another start before the lock is back.
  mu_.Unlock();
  const DiskReader::RequestId id =
      reader_.Submit({std::move(targets), priority, deadline, [this, entry](absl::Status status) {
                        FinishRead(entry, std::move(status));
                      }});
  mu_.Lock();
  --entry->submits_pending;
  --submits_pending_;
  if (entry->state == Entry::State::kLoading && entry->load == load && !entry->read_id) {
    entry->read_id = id;
    // A demand fetch that came while the lock was dropped could not promote the read yet.
    if (entry->demand && priority != ReadPriority::kDemand) {
      reader_.Reprioritize(id, ReadPriority::kDemand, deadline);
    }
  }
  DeleteIfUnusedLocked(entry);
}

std::vector<ReadTarget> HostCache::TargetsLocked(const Entry* entry) const {
  std::vector<ReadTarget> targets;
  uint8_t* base = arena_.data(*entry->memory) + entry->head;
  if (entry->kind == Entry::Kind::kStored) {
    // A spill file holds the object from a page boundary, and the allocation is whole pages.
    targets.push_back(
        {entry->spill_path, entry->spill_offset, entry->size, base, /*aligned_window=*/true});
    return targets;
  }
  // One extent starting the object has its aligned window in the allocation (see head); gathered
  // objects go through the reader's bounce buffers.
  const std::vector<Extent>& extents = entry->source->object->extents;
  // In place only when the one extent is the whole object: the aligned window overwrites the
  // bytes after it, which in a gathered object would be a gap (zeroed below, and hashed as zeros).
  const bool in_place = extents.size() == 1 && extents[0].object_offset == 0 &&
                        extents[0].length == entry->source->object->size;
  const ModelInfo& model = *entry->source->model;
  // The memory may hold an evicted object's bytes: the gaps between gathered tensors, which no
  // read fills, must not make the checksum differ from the last read's.
  ZeroObjectGaps(*entry->source->object, base);
  for (const Extent& extent : extents) {
    const ModelFile& file = model.files[extent.file];
    ReadTarget& target = targets.emplace_back();
    target.path = file.path;
    target.offset = extent.file_offset;
    target.length = extent.length;
    target.destination = base + extent.object_offset;
    target.aligned_window = in_place;
    target.model_file = &file;  // the entry's source keeps the model alive while it loads
  }
  return targets;
}

void HostCache::FinishRead(Entry* entry, absl::Status status) {
  // Checksum without the lock: nothing else touches a loading entry's memory.
  if (status.ok()) {
    const uint64_t checksum =
        ObjectChecksum(arena_.data(*entry->memory) + entry->head, entry->size);
    if (entry->kind == Entry::Kind::kWeight) {
      if (std::optional<uint64_t> expected = catalog_.Checksum(entry->key); !expected) {
        catalog_.RecordChecksum(entry->key, checksum);
      } else if (*expected != checksum) {
        status = absl::DataLossError(absl::StrFormat(
            "%s: checksum %016x differs from %016x recorded at registration or its first read; "
            "the file's bytes changed on disk",
            entry->key, checksum, *expected));
      }
    } else if (checksum != entry->checksum) {
      status = absl::DataLossError(
          absl::StrFormat("%s: its copy on disk has checksum %016x, the stored object had "
                          "%016x",
                          entry->key, checksum, entry->checksum));
    }
  } else if (entry->kind == Entry::Kind::kWeight &&
             (absl::IsFailedPrecondition(status) || absl::IsPermissionDenied(status))) {
    // A model file changed or was replaced by a link since registration: every object of the
    // model is refused from now on, and the listing says why.
    catalog_.MarkStale(entry->source->model, std::string(status.message()));
  }
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --reads_in_flight_;
  entry->read_id.reset();
  if (status.code() == absl::StatusCode::kCancelled && entry->demand && entry->listed) {
    // A demand fetch came between CancelPrefetch's decision and the cancel: read after all.
    return StartReadLocked(entry, TargetsLocked(entry), ReadPriority::kDemand,
                           absl::InfiniteFuture());
  }
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kDataLoss) {
      ++stats_.checksum_failures;
      TIERD_LOG(ERROR) << status;
    }
    return FailLoadLocked(entry, status, deferred.calls());
  }
  stats_.bytes_from_disk += entry->size;
  entry->state = Entry::State::kResident;
  entry->demand = false;
  entry->position = order_.insert(order_.end(), entry);
  entry->in_order = true;
  for (FetchCallback& done : entry->waiters) {
    DeferAnswer(deferred.calls(), std::move(done), RefLocked(entry));
  }
  entry->waiters.clear();
  DeleteIfUnusedLocked(entry);
}

void HostCache::FailLoadLocked(Entry* entry, const absl::Status& status, Deferred& deferred) {
  for (FetchCallback& done : entry->waiters) DeferAnswer(deferred, std::move(done), status);
  entry->waiters.clear();
  entry->demand = false;
  if (entry->memory) {
    arena_.Free(*entry->memory);
    entry->memory.reset();
  }
  entry->state = Entry::State::kSpilled;
  if (entry->kind == Entry::Kind::kStored && entry->listed && !LosesStoredObject(status)) {
    // The spilled copy is still good: the object stays, on disk.
  } else {
    RemoveLocked(entry);
  }
  RetryWaitersLocked(deferred);
}

void HostCache::ReserveStore(const std::string& key, uint64_t bytes, bool spillable,
                             FetchCallback done) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  if (key.empty() || bytes == 0) {
    DeferAnswer(deferred.calls(), std::move(done),
                absl::InvalidArgumentError("a stored object needs a key and a size"));
    return;
  }
  auto* entry = new Entry;
  entry->key = key;
  entry->kind = Entry::Kind::kStored;
  entry->state = Entry::State::kAllocating;
  entry->size = bytes;
  entry->spillable = spillable && spill_ != nullptr;
  ++allocations_pending_;
  AllocateLocked(
      bytes,
      [this, entry, done = std::move(done)](absl::StatusOr<ArenaAllocation> memory) mutable {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        --allocations_pending_;
        if (!memory.ok()) {
          delete entry;
          DeferAnswer(later.calls(), std::move(done), memory.status());
          return;
        }
        entry->memory = *memory;
        entry->state = Entry::State::kWriting;
        DeferAnswer(later.calls(), std::move(done), RefLocked(entry));
      },
      deferred.calls());
}

absl::Status HostCache::CommitStore(HostObject& reservation) {
  if (reservation.cache_ != this || reservation.entry_ == nullptr) {
    return absl::FailedPreconditionError("not a reservation of this cache");
  }
  Entry* entry = reservation.entry_;
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  if (entry->state != Entry::State::kWriting) {
    return absl::FailedPreconditionError(
        absl::StrCat(entry->key, ": committing a buffer that is not an open reservation"));
  }
  entry->state = Entry::State::kResident;
  if (auto it = entries_.find(entry->key); it != entries_.end()) {
    Entry* old = it->second;
    entry->pins = std::exchange(old->pins, 0);  // pins belong to the key
    RemoveLocked(old);
    // The old version's memory may be free now.
    RetryWaitersLocked(deferred.calls());
  }
  entries_[entry->key] = entry;
  entry->listed = true;
  entry->position = order_.insert(order_.end(), entry);
  entry->in_order = true;
  return absl::OkStatus();
}

void HostCache::Release(Entry* entry) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --entry->refs;
  if (entry->refs > 0) return;
  if (entry->state == Entry::State::kWriting) {
    // A reservation dropped without commit.
    arena_.Free(*entry->memory);
    delete entry;
  } else if (!entry->listed) {
    RemoveLocked(entry);
  }
  // The entry may have become evictable, or memory was freed: let waiting allocations retry.
  RetryWaitersLocked(deferred.calls());
}

std::optional<ArenaAllocation> HostCache::TryAllocateLocked(uint64_t bytes) {
  if (std::optional<ArenaAllocation> memory = arena_.Allocate(bytes)) return memory;
  // While pinning still adds memory that will fit it, wait for that rather than evict.
  if (arena_.pinning() && arena_.capacity() - arena_.used_bytes() >= bytes) return std::nullopt;
  // Evict only when that can be enough: a request larger than everything free and evictable
  // together must not empty the cache for nothing.
  uint64_t reclaimable = arena_.pinned_bytes() - arena_.used_bytes();
  for (const Entry* candidate : order_) {
    if (IsEvictableLocked(candidate)) reclaimable += candidate->memory->size;
  }
  if (reclaimable < bytes) return std::nullopt;
  for (;;) {
    if (std::optional<ArenaAllocation> memory = arena_.Allocate(bytes)) return memory;
    Entry* victim = nullptr;
    for (Entry* candidate : order_) {
      if (IsEvictableLocked(candidate)) {
        victim = candidate;
        break;
      }
    }
    if (victim == nullptr) return std::nullopt;
    ++stats_.evictions;
    TIERD_VLOG(2) << "evicting " << victim->key << " (" << FormatByteSize(victim->size) << ")";
    DropResidentLocked(victim);
  }
}

void HostCache::DropResidentLocked(Entry* entry) {
  order_.erase(entry->position);
  entry->in_order = false;
  arena_.Free(*entry->memory);
  entry->memory.reset();
  entry->state = Entry::State::kSpilled;
  if (entry->kind == Entry::Kind::kWeight) {
    // Weights are read again from their model; forget the entry.
    entries_.erase(entry->key);
    delete entry;
  }
}

void HostCache::AllocateLocked(uint64_t bytes, AllocationCallback done, Deferred& deferred) {
  bytes = std::max<uint64_t>(bytes, 1);
  auto answer = [&](absl::StatusOr<ArenaAllocation> result) {
    DeferAnswer(deferred, std::move(done), std::move(result));
  };
  if (bytes > arena_.capacity()) {
    return answer(absl::ResourceExhaustedError(absl::StrCat("an object of ", FormatByteSize(bytes),
                                                            " does not fit in a host cache of ",
                                                            FormatByteSize(arena_.capacity()))));
  }
  // Earlier waiters go first.
  if (waiters_.empty()) {
    if (std::optional<ArenaAllocation> memory = TryAllocateLocked(bytes)) return answer(*memory);
  }
  // Spills under way, or pinning still adding memory, may make room: wait for them.
  if (SpillForLocked(bytes) || arena_.pinning()) {
    waiters_.push_back({bytes, std::move(done)});
    return;
  }
  return answer(absl::ResourceExhaustedError(
      absl::StrCat("host cache full: ", FormatByteSize(arena_.used_bytes()), " of ",
                   FormatByteSize(arena_.pinned_bytes()),
                   " held by objects that are in use, pinned, in flight "
                   "or cannot spill; ",
                   FormatByteSize(bytes), " needed")));
}

bool HostCache::SpillForLocked(uint64_t bytes) {
  if (spill_ == nullptr) return spilling_bytes_ > 0;
  for (Entry* entry : order_) {
    if (spilling_bytes_ >= bytes) break;
    if (entry->kind == Entry::Kind::kStored && entry->spillable && MaySpillAgain(*entry) &&
        entry->spill_path.empty() && entry->refs == 0 && entry->pins == 0 && !entry->busy() &&
        entry->state == Entry::State::kResident) {
      StartSpillLocked(entry);
    }
  }
  return spilling_bytes_ > 0;
}

void HostCache::StartSpillLocked(Entry* entry) {
  entry->spilling = true;
  spilling_bytes_ += entry->memory->size;
  const std::string path = absl::StrCat(spill_->directory(), "/", next_spill_id_++, ".spill");
  const uint8_t* data = arena_.data(*entry->memory);
  spill_->Write({path, data, entry->memory->size,
                 [this, entry, path, data, size = entry->size](absl::Status status) {
                   // Hashed here, on the writer's thread and without the lock, rather than at
                   // commit: only a spilled copy is ever checked, and commits stay cheap. The
                   // bytes cannot change: a committed object is immutable and stays in memory
                   // until FinishSpill.
                   const uint64_t checksum = status.ok() ? ObjectChecksum(data, size) : 0;
                   FinishSpill(entry, path, status, checksum);
                 }});
}

void HostCache::FinishSpill(Entry* entry, const std::string& path, const absl::Status& status,
                            uint64_t checksum) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  entry->spilling = false;
  spilling_bytes_ -= entry->memory->size;
  if (status.ok()) {
    ++stats_.spills;
    stats_.bytes_to_spill += entry->size;
    entry->spill_path = path;
    entry->checksum = checksum;
  } else {
    ++stats_.spill_failures;
    entry->spill_failed_at = absl::Now();
    TIERD_LOG(WARNING) << "spilling " << entry->key << " failed: " << status
                       << "; it stays in memory (tried again in "
                       << absl::FormatDuration(kSpillRetryDelay) << " at the earliest)";
  }
  if (!entry->listed) {
    // Deleted or replaced while it was being written.
    RemoveLocked(entry);
  } else if (status.ok() && IsEvictableLocked(entry)) {
    // Spilled to make room: free it now rather than at the next eviction scan.
    DropResidentLocked(entry);
  }
  RetryWaitersLocked(deferred.calls());
}

void HostCache::RetryWaitersLocked(Deferred& deferred) {
  while (!waiters_.empty()) {
    AllocationWaiter& waiter = waiters_.front();
    std::optional<ArenaAllocation> memory = TryAllocateLocked(waiter.bytes);
    // Wait for the spills, or for the pinning thread's next piece.
    if (!memory && (SpillForLocked(waiter.bytes) || arena_.pinning())) return;
    absl::StatusOr<ArenaAllocation> result =
        memory ? absl::StatusOr<ArenaAllocation>(*memory)
               : absl::ResourceExhaustedError(
                     absl::StrCat("host cache full: nothing more can be evicted or spilled to fit ",
                                  FormatByteSize(waiter.bytes)));
    DeferAnswer(deferred, std::move(waiter.done), std::move(result));
    waiters_.pop_front();
  }
}

void HostCache::RemoveLocked(Entry* entry) {
  if (entry->listed) {
    entries_.erase(entry->key);
    entry->listed = false;
  }
  if (entry->in_order) {
    order_.erase(entry->position);
    entry->in_order = false;
  }
  if (entry->refs > 0 || entry->busy()) return;  // finished by the last Release or completion
  FreeEntryLocked(entry);
}

void HostCache::DeleteIfUnusedLocked(Entry* entry) {
  if (!entry->listed && entry->refs == 0 && !entry->busy() && entry->waiters.empty()) {
    FreeEntryLocked(entry);
  }
}

void HostCache::FreeEntryLocked(Entry* entry) {
  if (entry->in_order) order_.erase(entry->position);
  if (entry->memory) arena_.Free(*entry->memory);
  if (!entry->spill_path.empty()) {
    reader_.ForgetFile(entry->spill_path);
    if (!entry->durable_copy) ::unlink(entry->spill_path.c_str());
  }
  delete entry;
}

void HostCache::SetDurableCopy(const HostObject& object, const DurableRecord& record) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Entry* entry = object.entry_;
  entry->spill_path = record.path;
  entry->spill_offset = record.payload_offset;
  entry->durable_copy = true;
  entry->checksum = record.checksum;
  RetryWaitersLocked(deferred.calls());  // it may now be evicted to make room
}

absl::Status HostCache::AdoptDurable(const DurableRecord& record) {
  absl::MutexLock lock(&mu_);
  if (entries_.count(record.key) > 0) {
    return absl::AlreadyExistsError(absl::StrCat(record.key, " is already in the host cache"));
  }
  auto* entry = new Entry;
  entry->key = record.key;
  entry->kind = Entry::Kind::kStored;
  entry->state = Entry::State::kSpilled;
  entry->size = record.size;
  entry->spill_path = record.path;
  entry->spill_offset = record.payload_offset;
  entry->durable_copy = true;
  entry->checksum = record.checksum;
  entry->listed = true;
  entries_[record.key] = entry;
  return absl::OkStatus();
}

absl::Status HostCache::Pin(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second->state != Entry::State::kResident) {
    return absl::NotFoundError(absl::StrCat(key, " is not resident in the host cache"));
  }
  ++it->second->pins;
  return absl::OkStatus();
}

absl::Status HostCache::Unpin(const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat(key, " is not cached"));
  if (it->second->pins == 0) {
    return absl::FailedPreconditionError(absl::StrCat(key, " is not pinned"));
  }
  if (--it->second->pins == 0) RetryWaitersLocked(deferred.calls());
  return absl::OkStatus();
}

absl::Status HostCache::Evict(const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat(key, " is not cached"));
  Entry* entry = it->second;
  if (entry->state == Entry::State::kSpilled && !entry->busy()) return absl::OkStatus();
  if (entry->refs > 0 || entry->pins > 0 || entry->busy()) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, " is in use, pinned or in flight and cannot be evicted"));
  }
  if (IsEvictableLocked(entry)) {
    ++stats_.evictions;
    DropResidentLocked(entry);
  } else if (entry->spillable && MaySpillAgain(*entry)) {
    StartSpillLocked(entry);
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        key, " is a stored object that may not spill; evicting it would lose it (delete it)"));
  }
  RetryWaitersLocked(deferred.calls());
  return absl::OkStatus();
}

absl::Status HostCache::Delete(const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second->kind != Entry::Kind::kStored) {
    return absl::NotFoundError(absl::StrCat("no stored object ", key));
  }
  RemoveLocked(it->second);
  RetryWaitersLocked(deferred.calls());
  return absl::OkStatus();
}

std::vector<std::string> HostCache::Keys(absl::string_view prefix) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  for (auto it = entries_.lower_bound(std::string(prefix));
       it != entries_.end() && absl::StartsWith(it->first, prefix); ++it) {
    keys.push_back(it->first);
  }
  return keys;
}

bool HostCache::IsResident(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  return it != entries_.end() && it->second->state == Entry::State::kResident;
}

HostCacheStats HostCache::stats() const {
  absl::MutexLock lock(&mu_);
  HostCacheStats stats = stats_;
  stats.capacity_bytes = arena_.capacity();
  stats.pinned_bytes = arena_.pinned_bytes();
  stats.used_bytes = arena_.used_bytes();
  stats.loading = reads_in_flight_;
  for (const auto& [key, entry] : entries_) {
    if (entry->state == Entry::State::kResident) ++stats.objects;
    if (entry->kind == Entry::Kind::kStored) {
      ++stats.stored_objects;
      if (entry->state == Entry::State::kSpilled) ++stats.spilled_objects;
    }
  }
  return stats;
}

}  // namespace tierd
