// HostCache's stored objects: reservations and commits, spills under pressure, durable copies and
// deletion. The rest of the cache is in host_cache.cc.
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/deferred_calls.h"
#include "common/log.h"
#include "storage/host/detail/host_cache_record.h"
#include "storage/host/host_cache.h"
#include "storage/model/object_checksum.h"

namespace tierd {

using Kind = HostCacheRecord::Kind;
using State = HostCacheRecord::State;

void HostCache::ReserveStore(const std::string& key, uint64_t bytes, bool spillable,
                             FetchCallback done) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  if (key.empty() || bytes == 0) {
    DeferAnswer(deferred.calls(), std::move(done),
                absl::InvalidArgumentError("a stored object needs a key and a size"));
    return;
  }
  if (!serving_) return DeferAnswer(deferred.calls(), std::move(done), NotServing());
  Entry* entry = table_.Create(key);  // unlisted until committed
  entry->kind = Kind::kStored;
  entry->state = State::kAllocating;
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
          entry->state = State::kSpilled;  // holds nothing, waits for nothing: it goes
          table_.FreeIfUnused(entry);
          DeferAnswer(later.calls(), std::move(done), memory.status());
          return;
        }
        entry->memory = *std::move(memory);
        entry->state = State::kWriting;
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
  if (entry->state != State::kWriting) {
    return absl::FailedPreconditionError(
        absl::StrCat(entry->key(), ": committing a buffer that is not an open reservation"));
  }
  if (catalog_.InModelNamespace(entry->key())) {
    // Registered while the object was being written: the key is the model's now.
    return absl::FailedPreconditionError(absl::StrCat(
        entry->key(), ": its namespace became a registered model while it was stored"));
  }
  entry->state = State::kResident;
  if (Entry* old = table_.Find(entry->key()); old != nullptr) {
    entry->pins = std::exchange(old->pins, 0);  // pins belong to the key
    RemoveLocked(old);
    // The old version's memory may be free now.
    table_.RetryWaiters(deferred.calls());
  }
  table_.Publish(entry);
  table_.Enqueue(entry);
  return absl::OkStatus();
}

bool HostCache::SpillForLocked(uint64_t bytes) {
  if (spill_ == nullptr) return spilling_bytes_ > 0;
  for (Entry* entry : table_.order()) {
    if (spilling_bytes_ >= bytes) break;
    if (entry->kind == Kind::kStored && entry->spillable && entry->MaySpillAgain() &&
        entry->spill_path.empty() && entry->refs == 0 && entry->pins == 0 && !entry->busy() &&
        entry->state == State::kResident) {
      StartSpillLocked(entry);
    }
  }
  return spilling_bytes_ > 0;
}

void HostCache::StartSpillLocked(Entry* entry) {
  entry->spilling = true;
  spilling_bytes_ += entry->memory->size();
  const std::string path = absl::StrCat(spill_->directory(), "/", next_spill_id_++, ".spill");
  const uint8_t* data = arena_.data(*entry->memory);
  spill_->Write({path, data, entry->memory->size(),
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
  spilling_bytes_ -= entry->memory->size();
  if (status.ok()) {
    ++stats_.spills;
    stats_.bytes_to_spill += entry->size;
    entry->spill_path = path;
    entry->checksum = checksum;
    entry->whole_object_checksum = false;  // ObjectChecksum's
  } else {
    ++stats_.spill_failures;
    entry->spill_failed_at = absl::Now();
    TIERD_LOG(WARNING) << "spilling " << entry->key() << " failed: " << status
                       << "; it stays in memory (tried again in "
                       << absl::FormatDuration(kSpillRetryDelay) << " at the earliest)";
  }
  if (!entry->listed()) {
    // Deleted or replaced while it was being written.
    table_.FreeIfUnused(entry);
  } else if (status.ok() && table_.IsEvictable(*entry)) {
    // Spilled to make room: free it now rather than at the next eviction scan.
    DropResidentLocked(entry);
  }
  table_.RetryWaiters(deferred.calls());
}

void HostCache::SetDurableCopy(const HostObject& object, const DurableRecord& record) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Entry* entry = object.entry_;
  entry->spill_path = record.path;
  entry->spill_offset = record.payload_offset;
  entry->durable_copy = true;
  entry->checksum = record.checksum;
  entry->whole_object_checksum = record.whole_object_checksum;
  table_.RetryWaiters(deferred.calls());  // it may now be evicted to make room
}

absl::Status HostCache::AdoptDurable(const DurableRecord& record) {
  absl::MutexLock lock(&mu_);
  if (table_.Find(record.key) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat(record.key, " is already in the host cache"));
  }
  Entry* entry = table_.Create(record.key);
  entry->kind = Kind::kStored;
  entry->state = State::kSpilled;
  entry->size = record.size;
  entry->spill_path = record.path;
  entry->spill_offset = record.payload_offset;
  entry->durable_copy = true;
  entry->checksum = record.checksum;
  entry->whole_object_checksum = record.whole_object_checksum;
  table_.Publish(entry);
  return absl::OkStatus();
}

absl::Status HostCache::Delete(const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Entry* entry = table_.Find(key);
  if (entry == nullptr || entry->kind != Kind::kStored) {
    return absl::NotFoundError(absl::StrCat("no stored object ", key));
  }
  RemoveLocked(entry);
  table_.RetryWaiters(deferred.calls());
  return absl::OkStatus();
}

}  // namespace tierd
