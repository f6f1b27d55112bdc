// Host ↔ staging copies issued in pieces, so that a demand copy on another stream is not stuck
// behind one huge copy, and so that no piece spans two pinned registrations of host memory (the
// CUDA driver treats a copy that spans two as pageable). Strided copies too: a tensor-parallel
// shard cut out of its whole object's host bytes on the way to staging.
#ifndef TIERD_GPU_CHUNKED_COPIER_H_
#define TIERD_GPU_CHUNKED_COPIER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "device/device.h"
#include "device/pinned_pieces.h"
#include "storage/model.h"

namespace tierd {

// Stateless beyond its configuration; thread-safe as far as the device's CopyAsync is.
class ChunkedCopier {
 public:
  // `device` and `pieces` must outlive this. REQUIRES: chunk_bytes > 0.
  ChunkedCopier(Device& device, const PinnedPieceBoundaries& pieces, uint64_t chunk_bytes)
      : device_(device), pieces_(pieces), chunk_bytes_(chunk_bytes) {}
  ChunkedCopier(const ChunkedCopier&) = delete;
  ChunkedCopier& operator=(const ChunkedCopier&) = delete;

  // Enqueues the copy on `stream` in pieces of at most chunk_bytes, for ranges outside pinned
  // host pieces (staging to staging, or the host handoff buffer). Returns the first enqueue
  // error; pieces before it may still be queued.
  absl::Status CopyInPieces(Stream& stream, uint8_t* dst, const uint8_t* src, uint64_t bytes);
  // As CopyInPieces, and no piece spans two pinned pieces of the host side (`dst` when
  // `host_is_dst`, `src` otherwise).
  absl::Status CopyChunked(Stream& stream, uint8_t* dst, const uint8_t* src, uint64_t bytes,
                           bool host_is_dst) {
    return CopyChunked(stream, dst, src, bytes, host_is_dst, pieces_);
  }
  // As above, for host memory whose registrations `pieces` describes (another daemon's arena).
  absl::Status CopyChunked(Stream& stream, uint8_t* dst, const uint8_t* src, uint64_t bytes,
                           bool host_is_dst, const PinnedPieceBoundaries& pieces);
  // Enqueues the copies `ranges` describe from host memory `src` (registered as `pieces` says)
  // to `dst`: each range's rows in 2-D copies of at most about chunk_bytes, none spanning two
  // pinned pieces (a row that does is copied as CopyChunked copies). REQUIRES: every range lies
  // within both sides' memory. Returns the first enqueue error; copies before it may be queued.
  absl::Status CopyStrided(Stream& stream, uint8_t* dst, const uint8_t* src,
                           absl::Span<const StridedRange> ranges,
                           const PinnedPieceBoundaries& pieces);

 private:
  Device& device_;
  const PinnedPieceBoundaries& pieces_;
  const uint64_t chunk_bytes_;
};

}  // namespace tierd

#endif  // TIERD_GPU_CHUNKED_COPIER_H_
