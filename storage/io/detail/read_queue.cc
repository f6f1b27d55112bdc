#include "storage/io/detail/read_queue.h"

namespace tierd {

void ReadQueue::Push(Id id, ReadPriority priority, absl::Time deadline) {
  const Key key{static_cast<int>(priority), deadline, id};
  order_.insert(key);
  keys_.emplace(id, key);
}

bool ReadQueue::Remove(Id id) {
  auto it = keys_.find(id);
  if (it == keys_.end()) return false;
  order_.erase(it->second);
  keys_.erase(it);
  return true;
}

bool ReadQueue::Reprioritize(Id id, ReadPriority priority, absl::Time deadline) {
  if (!Remove(id)) return false;
  Push(id, priority, deadline);
  return true;
}

std::optional<ReadQueue::Id> ReadQueue::Front() const {
  if (order_.empty()) return std::nullopt;
  return std::get<2>(*order_.begin());
}

std::vector<ReadQueue::Id> ReadQueue::TakeAll() {
  std::vector<Id> ids;
  ids.reserve(order_.size());
  for (const Key& key : order_) ids.push_back(std::get<2>(key));
  order_.clear();
  keys_.clear();
  return ids;
}

}  // namespace tierd
