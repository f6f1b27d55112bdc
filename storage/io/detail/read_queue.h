// The requests a reader has yet to issue reads for, in the order every reader serves them: demand
// before prefetch, then the earliest deadline, then first come (the lowest id). It holds ids; its
// reader keeps the requests by id.
//
// Private to storage/io/ (the readers'). Thread-compatible: its reader's lock guards it.
#ifndef TIERD_STORAGE_IO_DETAIL_READ_QUEUE_H_
#define TIERD_STORAGE_IO_DETAIL_READ_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "storage/read_request.h"

namespace tierd {

class ReadQueue {
 public:
  using Id = Reader::RequestId;

  // Queues `id`. REQUIRES: it is not queued; ids come in increasing order of arrival.
  void Push(Id id, ReadPriority priority, absl::Time deadline);
  // Takes `id` out; false when it was not queued.
  bool Remove(Id id);
  // Moves a queued id to its new place; false when it is not queued.
  bool Reprioritize(Id id, ReadPriority priority, absl::Time deadline);
  // The id served next; nullopt when none is queued.
  std::optional<Id> Front() const;
  bool Contains(Id id) const { return keys_.count(id) != 0; }
  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }
  // Takes every id out, in the order they would have been served (a reader stopping).
  std::vector<Id> TakeAll();

 private:
  using Key = std::tuple<int, absl::Time, Id>;
  std::set<Key> order_;
  std::map<Id, Key> keys_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_DETAIL_READ_QUEUE_H_
