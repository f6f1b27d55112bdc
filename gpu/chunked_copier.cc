#include "gpu/chunked_copier.h"

#include <algorithm>

#include "common/status_macros.h"

namespace tierd {

absl::Status ChunkedCopier::CopyInPieces(Stream& stream, uint8_t* dst, const uint8_t* src,
                                         uint64_t bytes) {
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(bytes - done, chunk_bytes_);
    RETURN_IF_ERROR(device_.CopyAsync(stream, dst + done, src + done, n));
    done += n;
  }
  return absl::OkStatus();
}

absl::Status ChunkedCopier::CopyChunked(Stream& stream, uint8_t* dst, const uint8_t* src,
                                        uint64_t bytes, bool host_is_dst,
                                        const PinnedPieceBoundaries& pieces) {
  const uint8_t* host = host_is_dst ? dst : src;
  uint64_t done = 0;
  while (done < bytes) {
    const uint64_t to_piece_end = pieces.BytesToPieceEnd(host + done);
    const uint64_t n = std::min({bytes - done, chunk_bytes_, to_piece_end});
    RETURN_IF_ERROR(device_.CopyAsync(stream, dst + done, src + done, n));
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace tierd
