#include "gpu/detail/staging_residency.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"

namespace tierd {

StagingResidency::StagingResidency(absl::Mutex& tier_mu, Device& device, const Catalog& catalog,
                                   StagingPool& pool, EventPool& events, GpuTierStats& stats,
                                   std::shared_ptr<Liveness> liveness,
                                   std::function<bool()> drains_pending)
    : mu_(tier_mu),
      device_(device),
      catalog_(catalog),
      pool_(pool),
      events_(events),
      stats_(stats),
      liveness_(std::move(liveness)),
      drains_pending_(std::move(drains_pending)) {}

// ---- Objects by key -----------------------------------------------------------------------------

StagingObject* StagingResidency::FindListed(const std::string& key) {
  mu_.AssertHeld();
  auto it = objects_.find(key);
  if (it == objects_.end()) return nullptr;
  StagingObject* object = it->second;
  if (object->model != nullptr) {
    // A weight copied from an older registration of its model must never be served.
    if (!catalog_.IsCurrent(object->model)) {
      Unlist(object);
      return nullptr;
    }
  }
  return object;
}

const StagingObject* StagingResidency::Listed(const std::string& key) const {
  mu_.AssertHeld();
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<StagingObject*> StagingResidency::Matching(const std::string& key_or_prefix,
                                                       bool prefix) {
  mu_.AssertHeld();
  std::vector<StagingObject*> matches;
  for (auto it = objects_.lower_bound(key_or_prefix);
       it != objects_.end() &&
       (prefix ? absl::StartsWith(it->first, key_or_prefix) : it->first == key_or_prefix);
       ++it) {
    matches.push_back(it->second);
  }
  return matches;
}

void StagingResidency::List(StagingObject* object) {
  mu_.AssertHeld();
  object->listed = true;
  objects_[object->key] = object;
}

void StagingResidency::Replace(StagingObject* object) {
  mu_.AssertHeld();
  if (auto old = objects_.find(object->key); old != objects_.end()) {
    StagingObject* previous = old->second;
    Unlist(previous);
    DeleteIfUnused(previous);
  }
  List(object);
  Touch(object);
}

void StagingResidency::Unlist(StagingObject* object) {
  mu_.AssertHeld();
  if (!object->listed) return;
  object->listed = false;
  objects_.erase(object->key);
  if (object->in_lru) {
    lru_.erase(object->lru_position);
    object->in_lru = false;
  }
}

size_t StagingResidency::listed_count() const {
  mu_.AssertHeld();
  return objects_.size();
}

void StagingResidency::Touch(StagingObject* object) {
  mu_.AssertHeld();
  if (object->in_lru) lru_.erase(object->lru_position);
  object->lru_position = lru_.insert(lru_.end(), object);
  object->in_lru = true;
}

void StagingResidency::TouchOrDeleteIfUnused(StagingObject* object) {
  if (object->listed) {
    Touch(object);
  } else {
    DeleteIfUnused(object);
  }
}

bool StagingResidency::IsEvictable(const StagingObject* object) const {
  return object->state == StagingObject::State::kResident && !object->copying &&
         object->leases == 0 && object->pins == 0 && object->waiters.empty() &&
         object->host_fetches == 0;
}

void StagingResidency::Free(StagingObject* object) {
  Unlist(object);
  if (object->range) pool_.Free(*object->range);
  if (object->ready_event) events_.Release(*object->ready_event);
  delete object;
}

void StagingResidency::DeleteIfUnused(StagingObject* object) {
  if (object->listed || object->leases > 0 || object->pins > 0 || object->copying ||
      object->host_fetches > 0 || object->state == StagingObject::State::kAllocating ||
      object->state == StagingObject::State::kFetchingPeer || !object->waiters.empty()) {
    return;
  }
  Free(object);
}

void StagingResidency::DeleteAllListed() {
  mu_.AssertHeld();
  for (auto& [key, object] : objects_) delete object;
  objects_.clear();
  lru_.clear();
}

// ---- Room ---------------------------------------------------------------------------------------

std::optional<StagingRange> StagingResidency::TryAllocate(uint64_t bytes) {
  mu_.AssertHeld();
  while (true) {
    if (std::optional<StagingRange> range = pool_.Allocate(bytes)) return range;
    auto victim = std::find_if(lru_.begin(), lru_.end(),
                               [this](StagingObject* object) { return IsEvictable(object); });
    if (victim == lru_.end()) return std::nullopt;
    ++stats_.evictions;
    TIERD_VLOG(2) << "GPU tier evicts " << (*victim)->key;
    Free(*victim);
  }
}

void StagingResidency::Allocate(uint64_t bytes, AllocationCallback done, Deferred& deferred) {
  mu_.AssertHeld();
  // Waiters are served in order: a new request does not jump the queue.
  std::optional<StagingRange> range;
  if (allocation_waiters_.empty()) range = TryAllocate(bytes);
  if (range) {
    return DeferAnswer(deferred, std::move(done), absl::StatusOr<StagingRange>(*range));
  }
  if (RoomMayCome() || !allocation_waiters_.empty()) {
    allocation_waiters_.push_back({bytes, std::move(done)});
    return;
  }
  DeferAnswer(deferred, std::move(done), PoolExhausted(bytes));
}

void StagingResidency::RetryAllocations(Deferred& deferred) {
  mu_.AssertHeld();
  while (!allocation_waiters_.empty()) {
    AllocationWaiter& waiter = allocation_waiters_.front();
    std::optional<StagingRange> range = TryAllocate(waiter.bytes);
    if (!range) {
      if (RoomMayCome()) return;  // more room may come
      DeferAnswer(deferred, std::move(waiter.done), PoolExhausted(waiter.bytes));
    } else {
      DeferAnswer(deferred, std::move(waiter.done), absl::StatusOr<StagingRange>(*range));
    }
    allocation_waiters_.pop_front();
  }
}

bool StagingResidency::RoomMayCome() const { return copies_in_flight_ > 0 || drains_pending_(); }

size_t StagingResidency::allocation_waiters() const {
  mu_.AssertHeld();
  return allocation_waiters_.size();
}

void StagingResidency::CopyStarted() {
  mu_.AssertHeld();
  ++copies_in_flight_;
}

void StagingResidency::CopyFinished() {
  mu_.AssertHeld();
  --copies_in_flight_;
}

uint64_t StagingResidency::copies_in_flight() const {
  mu_.AssertHeld();
  return copies_in_flight_;
}

absl::Status StagingResidency::PoolExhausted(uint64_t bytes) const {
  uint64_t leased = 0, pinned = 0;
  for (const auto& [key, object] : objects_) {
    if (!object->range) continue;
    if (object->leases > 0) {
      leased += object->range->size;
    } else if (object->pins > 0) {
      pinned += object->range->size;
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "GPU staging pool full: ", FormatByteSize(bytes), " needed; ",
      FormatByteSize(pool_.used_bytes()), " of ", FormatByteSize(pool_.capacity()), " in use (",
      FormatByteSize(leased), " leased, ", FormatByteSize(pinned),
      " pinned, the rest reserved for stores); release leases or raise --gpu-pool-bytes"));
}

void StagingResidency::FreeRange(StagingRange range, std::optional<uint32_t> event) {
  pool_.Free(range);
  if (event.has_value()) events_.Release(*event);
}

void StagingResidency::FreeAfterStream(Stream& stream, StagingRange range,
                                       std::optional<uint32_t> event, const std::string& what,
                                       const absl::Status& error) {
  const absl::Status arranged =
      device_.NotifyWhenDone(stream, [this, live = liveness_, range, event] {
        live->RunIfAlive([&] { FreeAfterFailedCopy(range, event); });
      });
  if (arranged.ok()) {
    TIERD_LOG(ERROR) << what << " failed: " << error
                     << "; its staging range is freed once the stream has run what was queued";
    return;
  }
  TIERD_LOG(ERROR) << what << " failed: " << error << ", and the device cannot say when its "
                   << "stream is done (" << arranged << "); its staging range and event are "
                   << "retired";
}

void StagingResidency::FreeAfterFailedCopy(StagingRange range, std::optional<uint32_t> event) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  FreeRange(range, event);
  RetryAllocations(deferred.calls());
}

}  // namespace tierd
