#include "gpu/event_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tierd {

EventPool::EventPool(Device& device, uint32_t max_events, uint32_t batch)
    : device_(device), max_events_(max_events), batch_(std::max<uint32_t>(batch, 1)) {}

absl::Status EventPool::Prefill() {
  absl::MutexLock lock(&mu_);
  if (!events_.empty() || max_events_ == 0) return absl::OkStatus();
  // Sessions' done events are what every client needs first.
  return GrowLocked(EventUse::kClientRecords);
}

uint32_t EventPool::RoomLocked(EventUse use) const {
  const uint32_t total = events_.size();
  uint32_t room = max_events_ - total;
  if (use == EventUse::kClientRecords) {
    // Done events never become ready events: they may not take the whole pool, or copies would
    // find none once many sessions had come and gone.
    const uint32_t for_clients = max_events_ - max_events_ / 4;
    room = std::min(room, for_clients - std::min(for_clients, created_for_clients_));
  }
  return room;
}

absl::Status EventPool::GrowLocked(EventUse use) {
  const uint32_t have = events_.size();
  const uint32_t grow = std::min(batch_, RoomLocked(use));
  // Created under the lock: growing is rare, and ids must stay dense.
  for (uint32_t i = 0; i < grow; ++i) {
    absl::StatusOr<std::unique_ptr<Event>> event = device_.CreateEvent();
    if (!event.ok()) {
      if (i > 0) break;
      return event.status();
    }
    events_.push_back(*std::move(event));
    use_.push_back(use);
    if (use == EventUse::kClientRecords) ++created_for_clients_;
  }
  std::vector<uint32_t>& free = FreeLocked(use);
  for (uint32_t id = events_.size(); id > have; --id) free.push_back(id - 1);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> EventPool::Acquire(EventUse use) {
  absl::MutexLock lock(&mu_);
  std::vector<uint32_t>& free = FreeLocked(use);
  if (free.empty()) {
    if (RoomLocked(use) == 0) {
      ++shortfalls_;
      return absl::ResourceExhaustedError(absl::StrCat(
          "no interprocess event is free for ",
          use == EventUse::kClientRecords ? "a session's done events" : "a copy", ": this tier's ",
          events_.size(), " of ", max_events_, " are in use (its share of ", kSizeFlag, ")"));
    }
    if (absl::Status grown = GrowLocked(use); !grown.ok()) {
      ++shortfalls_;
      return absl::Status(
          grown.code(), absl::StrCat("creating an interprocess event (", events_.size(), " exist, ",
                                     kSizeFlag, "=", max_events_, "): ", grown.message()));
    }
  }
  const uint32_t id = free.back();
  free.pop_back();
  return id;
}

void EventPool::Release(uint32_t id) {
  absl::MutexLock lock(&mu_);
  FreeLocked(use_[id]).push_back(id);
}

Event& EventPool::event(uint32_t id) const {
  absl::MutexLock lock(&mu_);
  return *events_[id];
}

const std::string& EventPool::handle(uint32_t id) const {
  absl::MutexLock lock(&mu_);
  return events_[id]->handle();
}

std::vector<EventInfo> EventPool::Events() const {
  absl::MutexLock lock(&mu_);
  std::vector<EventInfo> infos;
  for (uint32_t id = 0; id < events_.size(); ++id) infos.push_back({id, events_[id]->handle()});
  return infos;
}

EventPoolStats EventPool::stats() const {
  absl::MutexLock lock(&mu_);
  EventPoolStats stats;
  stats.created = events_.size();
  stats.in_use = events_.size() - free_for_daemon_.size() - free_for_clients_.size();
  stats.max = max_events_;
  stats.shortfalls = shortfalls_;
  return stats;
}

}  // namespace tierd
