#include "wire/done_events.h"

#include <cstdio>
#include <string>
#include <utility>

namespace tierd {

DoneEvents::DoneEvents(Device& device, std::vector<Opened> events)
    : device_(device), size_(events.size()) {
  for (Opened& opened : events) slots_.push_back(Slot{opened, 0, 0});
}

DoneEvents::Slot* DoneEvents::Choose(const Stream& stream) {
  if (slots_.empty()) return nullptr;
  for (Slot& slot : slots_) {
    if (slot.stream_id == stream.id()) return &slot;
  }
  Slot* oldest = &slots_.front();
  for (Slot& slot : slots_) {
    if (slot.stream_id == 0) return &slot;
    absl::StatusOr<bool> complete = device_.QueryEvent(*slot.opened.event);
    if (complete.ok() && *complete) return &slot;
    if (slot.recorded_at < oldest->recorded_at) oldest = &slot;
  }
  // Every event is busy on another stream: wait for the one recorded first. Where even that
  // fails its record may still be pending, and recording it again could let the daemon reuse a
  // buffer too soon: none is chosen.
  if (absl::Status waited = device_.SynchronizeEvent(*oldest->opened.event); !waited.ok()) {
    std::fprintf(stderr, "tierd client: waiting for done event %u failed (%s)\n", oldest->opened.id,
                 std::string(waited.message()).c_str());
    return nullptr;
  }
  return oldest;
}

absl::StatusOr<std::optional<uint32_t>> DoneEvents::RecordAfter(Stream& stream, const char* what,
                                                                uint64_t id) {
  if (absl::StatusOr<bool> idle = device_.QueryStream(stream); idle.ok() && *idle) {
    return std::nullopt;
  }
  {
    absl::MutexLock lock(&mu_);
    if (Slot* slot = Choose(stream); slot != nullptr) {
      const absl::Status recorded = device_.RecordEvent(*slot->opened.event, stream);
      if (recorded.ok()) {
        slot->stream_id = stream.id();
        slot->recorded_at = ++records_;
        return slot->opened.id;
      }
      std::fprintf(stderr,
                   "tierd client: cannot record the done event of %s %llu (%s); waiting for the "
                   "stream instead\n",
                   what, static_cast<unsigned long long>(id),
                   std::string(recorded.message()).c_str());
    }
  }
  // Without a record the daemon could reuse the buffer while the stream still uses it: the CPU
  // waits for the stream instead, and the release or commit names no event.
  if (absl::Status synced = device_.SynchronizeStream(stream); !synced.ok()) {
    std::fprintf(stderr, "tierd client: waiting for the stream of %s %llu failed (%s)\n", what,
                 static_cast<unsigned long long>(id), std::string(synced.message()).c_str());
    return synced;
  }
  return std::nullopt;
}

}  // namespace tierd
