// A session's done events on the client's side (SessionOpened.done_event_ids): which one to record
// after the last use of a lease or the last write into a reservation, to name in the release or
// commit.
//
// The daemon waits for the newest record of the event a release names, which may be a later record
// than the release's own. That is safe when every record since the release's own came after it on
// the same stream (stream order), or when the release's record had completed before the event was
// recorded again. So an event is recorded again only on the stream of its last record, or once
// that record has completed. The choice, for a stream:
//   1. the event last recorded on this stream: one event per stream, however far the CPU runs
//      ahead of the GPU;
//   2. else an event never recorded, or whose last record has completed (QueryEvent);
//   3. else, all events being busy on other streams, the least recently recorded one once the CPU
//      has waited for its record.
// A stream whose work has all completed needs no event: nothing is named, and the daemon frees the
// buffer at once without touching an interprocess event (which costs more, across processes, than
// a query of the stream). With no done events (the daemon had none to give), or when recording
// fails, the stream is synchronized on the CPU instead and nothing is named either.
//
// Thread-safe.
#ifndef TIERD_WIRE_DONE_EVENTS_H_
#define TIERD_WIRE_DONE_EVENTS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"

namespace tierd {

class DoneEvents {
 public:
  struct Opened {
    uint32_t id = 0;
    Event* event = nullptr;  // opened in this process; must outlive this
  };

  // `device` must outlive this.
  DoneEvents(Device& device, std::vector<Opened> events);
  DoneEvents(const DoneEvents&) = delete;
  DoneEvents& operator=(const DoneEvents&) = delete;

  // Records a done event on `stream`, after the work enqueued there, and returns its id to name
  // in the release or commit; nullopt when none is needed (the stream is idle, or was
  // synchronized instead). The device's error when even synchronizing failed: then nothing says
  // the stream is done, and the caller must not release (the session's end frees what it holds).
  // `what` and `id` name the release or commit ("lease", 12) in the message printed when
  // recording fails.
  absl::StatusOr<std::optional<uint32_t>> RecordAfter(Stream& stream, const char* what, uint64_t id)
      ABSL_LOCKS_EXCLUDED(mu_);

  size_t size() const { return size_; }

 private:
  struct Slot {
    Opened opened;
    uint64_t stream_id = 0;    // of its last record; 0: never recorded
    uint64_t recorded_at = 0;  // a counter: which slot was recorded least recently
  };

  // The slot to record on `stream` (rules 1 to 3 above; waits on the CPU in case 3), or null when
  // there is none or the wait failed.
  Slot* Choose(const Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Device& device_;
  const size_t size_;
  absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t records_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_WIRE_DONE_EVENTS_H_
