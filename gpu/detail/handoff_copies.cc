#include "gpu/detail/handoff_copies.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tierd {

absl::StatusOr<uint64_t> HandoffCopies::CopyOut(const StagingObject& object,
                                                uint32_t copied_event) {
  mu_.AssertHeld();
  ASSIGN_OR_RETURN(const uint64_t offset, buffer_.Allocate(object.size));
  absl::Status copied;
  // Without a ready event the copy into staging has completed.
  if (object.ready_event) copied = device_.WaitEvent(stream_, events_.event(*object.ready_event));
  if (copied.ok()) {
    uint8_t* dst = buffer_.data() + offset;
    const auto* src = static_cast<const uint8_t*>(pool_.data(object.memory->range()));
    copied = copier_.CopyInPieces(stream_, dst, src, object.size);
  }
  if (copied.ok()) copied = device_.RecordEvent(events_.event(copied_event), stream_);
  if (!copied.ok()) {
    // Nothing recorded the event; pieces of the copy may still be queued.
    FreeLater(offset, object.size);
    return absl::Status(
        copied.code(),
        absl::StrCat("copying ", object.key(), " to the host handoff buffer: ", copied.message()));
  }
  stats_.bytes_gpu_to_host += object.size;
  return offset;
}

void HandoffCopies::FreeLater(uint64_t offset, uint64_t bytes) {
  const absl::Status arranged =
      device_.NotifyWhenDone(stream_, [this, live = liveness_, offset, bytes] {
        live->RunIfAlive([&] { buffer_.Free(offset, bytes); });
      });
  if (!arranged.ok()) {
    TIERD_LOG(ERROR) << "the device cannot say when the handoff stream is done (" << arranged
                     << "); " << bytes << " bytes of the host handoff buffer are retired";
  }
}

}  // namespace tierd
