// Copies of leased objects into the host handoff buffer, for a peer daemon whose GPU cannot read
// this one's memory (FetchOptions::through_host), and the return of the buffer's ranges.
//
// The copy is ordered by events only: the handoff stream waits on the object's ready event,
// copies, and records the lease's done event, which the peer waits on before reading.
//
// Internal to the GPU tier; CopyOut runs under the tier's lock (it counts into the tier's stats).
#ifndef TIERD_GPU_DETAIL_HANDOFF_COPIES_H_
#define TIERD_GPU_DETAIL_HANDOFF_COPIES_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/liveness.h"
#include "device/device.h"
#include "gpu/chunked_copier.h"
#include "gpu/detail/staging_object.h"
#include "gpu/detail/tier_parts.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/host_handoff_buffer.h"
#include "gpu/staging_pool.h"

namespace tierd {

class HandoffCopies {
 public:
  // The tier's shared parts, the stream the copies run on and the buffer they copy into; all
  // must outlive this. `liveness` is the tier's: marked gone before the parts go.
  HandoffCopies(const TierParts& tier, Stream& handoff_stream, HostHandoffBuffer& buffer,
                std::shared_ptr<Liveness> liveness)
      : mu_(tier.mu),
        device_(tier.device),
        pool_(tier.pool),
        events_(tier.events),
        stream_(handoff_stream),
        buffer_(buffer),
        copier_(tier.copier),
        stats_(tier.stats),
        liveness_(std::move(liveness)) {}
  HandoffCopies(const HandoffCopies&) = delete;
  HandoffCopies& operator=(const HandoffCopies&) = delete;

  // Copies resident `object` into a new range of the buffer after its ready event (if it still has
  // one) and records `copied_event` after that copy; returns the range's offset. The buffer's
  // RESOURCE_EXHAUSTED, or the device's error (then nothing recorded the event, and the range is
  // freed once the stream has run what was queued). REQUIRES: the tier's lock.
  absl::StatusOr<uint64_t> CopyOut(const StagingObject& object, uint32_t copied_event);
  // Frees a range whose copy and reader are done.
  void Free(uint64_t offset, uint64_t bytes) { buffer_.Free(offset, bytes); }
  // Frees a range once the handoff stream has run what is queued on it.
  void FreeLater(uint64_t offset, uint64_t bytes);

 private:
  absl::Mutex& mu_;
  Device& device_;
  StagingPool& pool_;
  EventPool& events_;
  Stream& stream_;
  HostHandoffBuffer& buffer_;
  ChunkedCopier& copier_;
  GpuTierStats& stats_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Liveness> liveness_;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_HANDOFF_COPIES_H_
