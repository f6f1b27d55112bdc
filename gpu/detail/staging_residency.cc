#include "gpu/detail/staging_residency.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"

namespace tierd {
namespace {

// A staging range that a stream may still use: handed back only through Take, once the stream
// has run what was queued. Dropped otherwise (the device could not arrange the callback, or the
// tier was gone when it ran), the range is retired: never freed, so never handed out again, and
// never freed into a pool that may be gone.
class RangeAfterStream {
 public:
  explicit RangeAfterStream(StagingAllocation memory) : memory_(std::move(memory)) {}
  RangeAfterStream(RangeAfterStream&&) = default;
  RangeAfterStream& operator=(RangeAfterStream&&) = delete;
  ~RangeAfterStream() { memory_.release(); }

  StagingAllocation Take() { return std::move(memory_); }

 private:
  StagingAllocation memory_;
};

}  // namespace

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
      drains_pending_(std::move(drains_pending)),
      table_(*this, EvictionPolicy::kLru) {}

// ---- Objects by key -----------------------------------------------------------------------------

StagingObject* StagingResidency::FindListed(const std::string& key) {
  mu_.AssertHeld();
  StagingObject* object = table_.Find(key);
  if (object == nullptr) return nullptr;
  if (object->model != nullptr) {
    // A weight copied from an older registration of its model must never be served; nothing
    // else will ask for it either.
    if (!catalog_.IsCurrent(object->model)) {
      table_.Remove(object);
      return nullptr;
    }
  }
  return object;
}

const StagingObject* StagingResidency::Listed(const std::string& key) const {
  mu_.AssertHeld();
  return table_.Find(key);
}

std::vector<StagingObject*> StagingResidency::Matching(const std::string& key_or_prefix,
                                                       bool prefix) {
  mu_.AssertHeld();
  std::vector<StagingObject*> matches;
  const auto& listed = table_.listed();
  for (auto it = listed.lower_bound(key_or_prefix);
       it != listed.end() &&
       (prefix ? absl::StartsWith(it->first, key_or_prefix) : it->first == key_or_prefix);
       ++it) {
    matches.push_back(it->second);
  }
  return matches;
}

StagingObject* StagingResidency::Create(std::string key) {
  mu_.AssertHeld();
  return table_.Create(std::move(key));
}

void StagingResidency::List(StagingObject* object) {
  mu_.AssertHeld();
  table_.Publish(object);
}

void StagingResidency::Replace(StagingObject* object) {
  mu_.AssertHeld();
  if (StagingObject* previous = table_.Find(object->key()); previous != nullptr) {
    table_.Remove(previous);
  }
  table_.Publish(object);
  table_.Enqueue(object);
}

void StagingResidency::Enqueue(StagingObject* object) {
  mu_.AssertHeld();
  table_.Enqueue(object);
}

void StagingResidency::Touch(StagingObject* object) {
  mu_.AssertHeld();
  table_.Touch(object);
}

void StagingResidency::TouchOrFreeIfUnused(StagingObject* object) {
  mu_.AssertHeld();
  table_.Touch(object);
  table_.FreeIfUnused(object);
}

bool StagingResidency::IsEvictable(const StagingObject* object) const {
  mu_.AssertHeld();
  return table_.IsEvictable(*object);
}

void StagingResidency::Remove(StagingObject* object) {
  mu_.AssertHeld();
  table_.Remove(object);
}

void StagingResidency::FreeIfUnused(StagingObject* object) {
  mu_.AssertHeld();
  table_.FreeIfUnused(object);
}

size_t StagingResidency::listed_count() const {
  mu_.AssertHeld();
  return table_.listed().size();
}

// ---- What the table asks ------------------------------------------------------------------------

bool StagingResidency::InFlight(const StagingObject& object) const {
  return object.copying || object.host_fetches > 0 ||
         object.state == StagingObject::State::kAllocating ||
         object.state == StagingObject::State::kFetchingPeer || !object.waiters.empty();
}

bool StagingResidency::CanEvict(const StagingObject& object) const {
  return object.state == StagingObject::State::kResident;
}

void StagingResidency::Evict(StagingObject& victim) {
  ++stats_.evictions;
  TIERD_VLOG(2) << "GPU tier evicts " << victim.key();
  table_.Remove(&victim);
}

void StagingResidency::DropReadyEventIfUnneeded(StagingObject* object) {
  mu_.AssertHeld();
  if (!object->ready_event || object->copying || object->ready_event_leases > 0) return;
  events_.Release(*object->ready_event);
  object->ready_event.reset();
}

void StagingResidency::Destroying(StagingObject& object) {
  if (object.ready_event) events_.Release(*object.ready_event);
}

std::optional<StagingAllocation> StagingResidency::AllocateFree(uint64_t bytes) {
  return pool_.Allocate(bytes);
}

// Evicts greedily, as long as anything is evictable.
bool StagingResidency::WorthEvicting(uint64_t, uint64_t) { return true; }

bool StagingResidency::RoomComing(uint64_t) { return copies_in_flight_ > 0 || drains_pending_(); }

absl::Status StagingResidency::NoRoom(uint64_t bytes, bool) { return PoolExhausted(bytes); }

// ---- Room ---------------------------------------------------------------------------------------

void StagingResidency::PreferPlacement(const std::string& key, const StagingRange& range) {
  mu_.AssertHeld();
  preferred_[key] = range;
}

std::optional<StagingAllocation> StagingResidency::TakePreferredPlacement(const std::string& key) {
  mu_.AssertHeld();
  auto it = preferred_.find(key);
  if (it == preferred_.end()) return std::nullopt;
  const StagingRange range = it->second;
  preferred_.erase(it);
  return pool_.AllocateAt(range);
}

void StagingResidency::ForgetPreferredPlacement(const std::string& key) {
  mu_.AssertHeld();
  preferred_.erase(key);
}

std::optional<StagingAllocation> StagingResidency::TryAllocate(uint64_t bytes) {
  mu_.AssertHeld();
  return table_.TryAllocate(bytes);
}

void StagingResidency::Allocate(uint64_t bytes, AllocationCallback done, Deferred& deferred) {
  mu_.AssertHeld();
  // Waiters are served in order: a new request does not jump the queue.
  table_.Allocate(bytes, std::move(done), deferred);
}

void StagingResidency::RetryAllocations(Deferred& deferred) {
  mu_.AssertHeld();
  table_.RetryWaiters(deferred);
}

size_t StagingResidency::allocation_waiters() const {
  mu_.AssertHeld();
  return table_.waiting();
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
  for (const auto& [key, object] : table_.listed()) {
    if (!object->memory) continue;
    if (object->refs > 0) {
      leased += object->memory->size();
    } else if (object->pins > 0) {
      pinned += object->memory->size();
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "GPU staging pool full: ", FormatByteSize(bytes), " needed; ",
      FormatByteSize(pool_.used_bytes()), " of ", FormatByteSize(pool_.capacity()), " in use (",
      FormatByteSize(leased), " leased, ", FormatByteSize(pinned),
      " pinned, the rest reserved for stores); release leases or raise --gpu-pool-bytes"));
}

void StagingResidency::FreeAfterStream(Stream& stream, StagingAllocation memory,
                                       std::optional<uint32_t> event, const std::string& what,
                                       const absl::Status& error) {
  const absl::Status arranged = device_.NotifyWhenDone(
      stream,
      [this, live = liveness_, range = RangeAfterStream(std::move(memory)), event]() mutable {
        live->RunIfAlive([&] { FreeAfterFailedCopy(range.Take(), event); });
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

void StagingResidency::FreeAfterFailedCopy(StagingAllocation memory,
                                           std::optional<uint32_t> event) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  memory.reset();
  if (event.has_value()) events_.Release(*event);
  RetryAllocations(deferred.calls());
}

}  // namespace tierd
