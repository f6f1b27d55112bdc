// A ring of device scratch memory handed out first in, first out, between one writer stream and
// one reader stream: each range taken makes the writer wait — on the GPU, never on the CPU — for
// the reads of what was there before, and is given back once its reads have been enqueued on the
// reader, by an event recorded there. Ranges are given back in the order they were taken and read
// on one stream, so waiting for the newest range that a new one overlaps waits for them all.
//
// Internal to the GPU tier. Not thread-safe: its owner serialises the calls.
#ifndef TIERD_GPU_DETAIL_SCRATCH_RING_H_
#define TIERD_GPU_DETAIL_SCRATCH_RING_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "device/device.h"

namespace tierd {

class ScratchRing {
 public:
  // `base` is `capacity` bytes of device memory; ranges start at multiples of `granule` (a power
  // of two dividing `capacity`, at least 16). The device, memory and streams outlive this.
  ScratchRing(Device& device, Stream& writer, Stream& reader, uint8_t* base, uint64_t capacity,
              uint64_t granule);
  ScratchRing(const ScratchRing&) = delete;
  ScratchRing& operator=(const ScratchRing&) = delete;

  uint64_t capacity() const { return capacity_; }

  // The next `bytes` (1..capacity) of the ring, contiguous: work enqueued on the writer after this
  // waits for the reads of what was there. REQUIRES: every range taken before was given back.
  absl::StatusOr<uint8_t*> Take(uint64_t bytes);
  // Gives the range of the last Take back: it is free once the reader has passed what was enqueued
  // on it so far. After an error here or in Take's wait the ring is unusable (every Take fails with
  // it): when the reads of its ranges end is no longer known.
  absl::Status GiveBack();

 private:
  struct Taken {
    uint64_t start;               // monotonic: the ring's offset is start % capacity_
    std::unique_ptr<Event> read;  // recorded on the reader's stream after its last read
  };

  Device& device_;
  Stream& writer_;
  Stream& reader_;
  uint8_t* const base_;
  const uint64_t capacity_;
  const uint64_t granule_;
  uint64_t head_ = 0;        // monotonic offset of the next range
  uint64_t open_start_ = 0;  // the range taken and not yet given back
  bool open_ = false;
  absl::Status broken_;      // a wait or give-back that failed
  std::deque<Taken> taken_;  // given back, oldest first, possibly still being read
  std::vector<std::unique_ptr<Event>> spare_events_;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_SCRATCH_RING_H_
