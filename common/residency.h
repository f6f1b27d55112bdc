// The residency core shared by the tiers: objects kept in a bounded memory, by key, with the rules
// that decide which of them may be dropped to make room, and the queue of requests waiting for it.
//
// A ResidencyTable owns its entries (never raw new/delete in the owner). An entry is
//  - listed while it is the one the table finds under its key; an entry replaced or removed is
//    unlisted and lives on until nothing uses it: no reference, no pin, no work in flight (the
//    owner says what is in flight) — then it is destroyed;
//  - in the eviction order while it is resident (Enqueue): FIFO keeps the order of arrival, LRU
//    moves an entry to the back each time it is used (Touch);
//  - evictable when it is in the order, not referenced, not pinned, not in flight, and the owner
//    says its bytes can be had again.
// Room is asked for with Allocate: it allocates at once, evicting in order where that can be
// enough; otherwise it waits while the owner says room is on its way (spills, copies, drains), and
// waiting requests are answered in order of arrival as RetryWaiters finds room; otherwise it fails.
//
// `Allocation` is a move-only handle that owns its memory (it frees it when destroyed) and has
// `uint64_t size() const`; an entry's memory is freed by resetting it. `Record` is the owner's own
// state of an object (what it is, its loading state, its callbacks): a default-constructible struct
// that Entry derives from, with no members named like Entry's.
//
// Externally synchronized: the owner declares the table ABSL_GUARDED_BY its mutex (so that clang's
// thread-safety analysis checks every use), and the table calls the owner's ResidencyOwner methods
// with that mutex held. Callbacks are never run by the table: answers go to the owner's deferred
// calls, to run once the mutex is released.
#ifndef TIERD_COMMON_RESIDENCY_H_
#define TIERD_COMMON_RESIDENCY_H_

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/deferred_calls.h"

namespace tierd {

enum class EvictionPolicy { kFifo, kLru };

template <typename Record, typename Allocation>
class ResidencyTable {
 public:
  class Entry;
  using AllocationCallback = absl::AnyInvocable<void(absl::StatusOr<Allocation>) &&>;

  // What the table needs to know from its owner. Called with the owner's mutex held, from inside
  // the table's methods; none may call back into the table except where said.
  class Owner {
   public:
    virtual ~Owner() = default;
    // True while work in flight (a read, a copy, a spill, an answer not given yet) uses `entry`:
    // it is then neither evicted nor destroyed.
    virtual bool InFlight(const Entry& entry) const = 0;
    // True when `entry`'s bytes can be had again (read back, copied again): it may be evicted
    // once it is idle.
    virtual bool CanEvict(const Entry& entry) const = 0;
    // Evicts `victim` (evictable) to make room: the owner counts it and calls Drop or Remove.
    virtual void Evict(Entry& victim) = 0;
    // `entry` is about to be destroyed (its memory goes with it): release what else it holds.
    virtual void Destroying(Entry& entry) = 0;
    // Memory of at least `bytes` from free space only, or nullopt.
    virtual std::optional<Allocation> AllocateFree(uint64_t bytes) = 0;
    // Whether evicting is worth it for `bytes` when evictable entries hold `evictable_bytes`
    // (evicting for a request that will fail anyway empties the cache for nothing).
    virtual bool WorthEvicting(uint64_t bytes, uint64_t evictable_bytes) = 0;
    // True when room for `bytes` is on its way (a spill, copy or drain in flight, memory still
    // being added): a request that cannot be served now waits for it. May start such work.
    virtual bool RoomComing(uint64_t bytes) = 0;
    // The refusal of a request for `bytes`: at once, or after it waited.
    virtual absl::Status NoRoom(uint64_t bytes, bool after_waiting) = 0;
  };

  // The owner's Record is a base, so that its fields read as the entry's own.
  class Entry : public Record {
   public:
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

    const std::string& key() const { return key_; }
    bool listed() const { return listed_; }
    bool in_order() const { return in_order_; }

    int refs = 0;  // references handed out (a HostObject, a lease)
    int pins = 0;  // pins keep a resident entry from being evicted
    std::optional<Allocation> memory;

   private:
    friend class ResidencyTable;
    explicit Entry(std::string key) : key_(std::move(key)) {}

    const std::string key_;
    bool listed_ = false;
    bool in_order_ = false;
    typename std::list<Entry*>::iterator order_position_;
    typename std::list<std::unique_ptr<Entry>>::iterator owned_position_;
  };

  ResidencyTable(Owner& owner, EvictionPolicy policy) : owner_(owner), policy_(policy) {}
  // Destroys every entry left, without calling the owner.
  ~ResidencyTable() = default;
  ResidencyTable(const ResidencyTable&) = delete;
  ResidencyTable& operator=(const ResidencyTable&) = delete;

  // ---- Entries ----

  // The listed entry under `key`, or null.
  Entry* Find(absl::string_view key) const {
    auto it = listed_.find(key);
    return it == listed_.end() ? nullptr : it->second;
  }
  // A new entry, unlisted and not resident. It is destroyed by FreeIfUnused or Remove once
  // unused, or with the table.
  Entry* Create(std::string key) {
    owned_.push_front(std::unique_ptr<Entry>(new Entry(std::move(key))));
    Entry* entry = owned_.front().get();
    entry->owned_position_ = owned_.begin();
    return entry;
  }
  // Lists `entry` under its key. REQUIRES: no entry is listed under it (Remove the old one first).
  void Publish(Entry* entry) {
    listed_[entry->key_] = entry;
    entry->listed_ = true;
  }
  // Unlists `entry` and takes it out of the eviction order; it is destroyed now if unused, or by
  // the FreeIfUnused that follows its last use.
  void Remove(Entry* entry) {
    if (entry->listed_) {
      listed_.erase(entry->key_);
      entry->listed_ = false;
    }
    LeaveOrder(entry);
    FreeIfUnused(entry);
  }
  // Destroys `entry` if it is unlisted and nothing uses it; true when it did. Call after each end
  // of a use of an unlisted entry (its last reference, pin or work in flight).
  bool FreeIfUnused(Entry* entry) {
    if (entry->listed_ || entry->refs > 0 || entry->pins > 0 || owner_.InFlight(*entry)) {
      return false;
    }
    LeaveOrder(entry);
    owner_.Destroying(*entry);
    owned_.erase(entry->owned_position_);  // frees its memory
    return true;
  }
  // Listed entries by key.
  const std::map<std::string, Entry*, std::less<>>& listed() const { return listed_; }

  // ---- Eviction order ----

  // `entry` became resident: it joins the back of the eviction order.
  void Enqueue(Entry* entry) {
    LeaveOrder(entry);
    entry->order_position_ = order_.insert(order_.end(), entry);
    entry->in_order_ = true;
  }
  // `entry` was used: under LRU it moves to the back of the order.
  void Touch(Entry* entry) {
    if (policy_ == EvictionPolicy::kLru && entry->in_order_) {
      order_.splice(order_.end(), order_, entry->order_position_);
    }
  }
  bool IsEvictable(const Entry& entry) const {
    return entry.in_order_ && entry.refs == 0 && entry.pins == 0 && !owner_.InFlight(entry) &&
           owner_.CanEvict(entry);
  }
  // Takes `entry` out of the order and frees its memory; it stays listed (the owner decides
  // whether to Remove it).
  void Drop(Entry* entry) {
    LeaveOrder(entry);
    entry->memory.reset();
  }
  // Resident entries, first to be evicted first.
  const std::list<Entry*>& order() const { return order_; }

  // ---- Room ----

  // Memory for `bytes` now, evicting in order where that can be enough; nullopt otherwise.
  std::optional<Allocation> TryAllocate(uint64_t bytes) {
    if (std::optional<Allocation> memory = owner_.AllocateFree(bytes)) return memory;
    uint64_t evictable_bytes = 0;
    for (const Entry* candidate : order_) {
      if (IsEvictable(*candidate) && candidate->memory)
        evictable_bytes += candidate->memory->size();
    }
    if (!owner_.WorthEvicting(bytes, evictable_bytes)) return std::nullopt;
    for (;;) {
      if (std::optional<Allocation> memory = owner_.AllocateFree(bytes)) return memory;
      Entry* victim = FirstEvictable();
      if (victim == nullptr) return std::nullopt;
      owner_.Evict(*victim);
    }
  }
  // Answers `done` (on `deferred`) with memory for `bytes`: now when no earlier request waits and
  // there is room; later, in order, when room is on its way; otherwise with the owner's NoRoom.
  void Allocate(uint64_t bytes, AllocationCallback done, DeferredCalls::Calls& deferred) {
    if (waiters_.empty()) {
      if (std::optional<Allocation> memory = TryAllocate(bytes)) {
        return DeferAnswer(deferred, std::move(done),
                           absl::StatusOr<Allocation>(*std::move(memory)));
      }
    }
    // Asked first: the owner may start the work (a spill) that makes room for this request.
    if (owner_.RoomComing(bytes) || !waiters_.empty()) {
      waiters_.push_back({bytes, std::move(done)});
      return;
    }
    DeferAnswer(deferred, std::move(done),
                absl::StatusOr<Allocation>(owner_.NoRoom(bytes, /*after_waiting=*/false)));
  }
  // Serves waiting requests in order while there is room; stops at the first that must wait
  // longer. Call whenever room may have been made or its prospects changed.
  void RetryWaiters(DeferredCalls::Calls& deferred) {
    while (!waiters_.empty()) {
      Waiter& waiter = waiters_.front();
      std::optional<Allocation> memory = TryAllocate(waiter.bytes);
      if (!memory && owner_.RoomComing(waiter.bytes)) return;
      absl::StatusOr<Allocation> result =
          memory ? absl::StatusOr<Allocation>(*std::move(memory))
                 : absl::StatusOr<Allocation>(owner_.NoRoom(waiter.bytes, /*after_waiting=*/true));
      DeferAnswer(deferred, std::move(waiter.done), std::move(result));
      waiters_.pop_front();
    }
  }
  size_t waiting() const { return waiters_.size(); }
  // Answers every waiting request with `status` (on `deferred`), as at shutdown.
  void FailWaiters(const absl::Status& status, DeferredCalls::Calls& deferred) {
    for (Waiter& waiter : waiters_) {
      DeferAnswer(deferred, std::move(waiter.done), absl::StatusOr<Allocation>(status));
    }
    waiters_.clear();
  }

 private:
  struct Waiter {
    uint64_t bytes;
    AllocationCallback done;
  };

  void LeaveOrder(Entry* entry) {
    if (!entry->in_order_) return;
    order_.erase(entry->order_position_);
    entry->in_order_ = false;
  }
  Entry* FirstEvictable() const {
    for (Entry* candidate : order_) {
      if (IsEvictable(*candidate)) return candidate;
    }
    return nullptr;
  }

  Owner& owner_;
  const EvictionPolicy policy_;
  // Every entry, listed or not; destroying one frees its memory.
  std::list<std::unique_ptr<Entry>> owned_;
  std::map<std::string, Entry*, std::less<>> listed_;
  std::list<Entry*> order_;
  std::deque<Waiter> waiters_;
};

}  // namespace tierd

#endif  // TIERD_COMMON_RESIDENCY_H_
