#include "gpu/event_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tierd {

EventPool::EventPool(Device& device, uint32_t max_events, uint32_t batch)
    : device_(device), max_events_(max_events), batch_(std::max<uint32_t>(batch, 1)) {}

absl::Status EventPool::Prefill() {
  absl::MutexLock lock(&mu_);
  if (!events_.empty() || max_events_ == 0) return absl::OkStatus();
  return GrowLocked();
}

absl::Status EventPool::GrowLocked() {
  const uint32_t have = events_.size();
  const uint32_t grow = std::min(batch_, max_events_ - have);
  // Created under the lock: growing is rare, and ids must stay dense.
  for (uint32_t i = 0; i < grow; ++i) {
    absl::StatusOr<std::unique_ptr<Event>> event = device_.CreateEvent();
    if (!event.ok()) {
      if (i > 0) break;
      return event.status();
    }
    events_.push_back(*std::move(event));
  }
  for (uint32_t id = events_.size(); id > have; --id) free_.push_back(id - 1);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> EventPool::Acquire() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) {
    if (events_.size() >= max_events_) {
      ++shortfalls_;
      return absl::ResourceExhaustedError(absl::StrCat("all ", max_events_,
                                                       " interprocess events are in use (",
                                                       kSizeFlag, "=", max_events_, ")"));
    }
    if (absl::Status grown = GrowLocked(); !grown.ok()) {
      ++shortfalls_;
      return absl::Status(
          grown.code(), absl::StrCat("creating an interprocess event (", events_.size(), " exist, ",
                                     kSizeFlag, "=", max_events_, "): ", grown.message()));
    }
  }
  const uint32_t id = free_.back();
  free_.pop_back();
  return id;
}

void EventPool::Release(uint32_t id) {
  absl::MutexLock lock(&mu_);
  free_.push_back(id);
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
  stats.in_use = events_.size() - free_.size();
  stats.max = max_events_;
  stats.shortfalls = shortfalls_;
  return stats;
}

}  // namespace tierd
