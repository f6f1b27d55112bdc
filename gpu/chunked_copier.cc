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

absl::Status ChunkedCopier::CopyStrided(Stream& stream, uint8_t* dst, const uint8_t* src,
                                        absl::Span<const StridedRange> ranges,
                                        const PinnedPieceBoundaries& pieces) {
  for (const StridedRange& range : ranges) {
    if (range.width == 0) continue;
    uint64_t row = 0;
    while (row < range.rows) {
      const uint8_t* from = src + range.src_offset + row * range.src_pitch;
      uint8_t* to = dst + range.dst_offset + row * range.dst_pitch;
      const uint64_t to_piece_end = pieces.BytesToPieceEnd(from);
      if (range.rows - row == 1 || range.width > to_piece_end || range.width >= chunk_bytes_) {
        // One row alone: the last, one that crosses into the next piece, or one a chunk long.
        RETURN_IF_ERROR(CopyChunked(stream, to, from, range.width, /*host_is_dst=*/false, pieces));
        ++row;
        continue;
      }
      // The rows from here that end within this piece, as many as make about a chunk.
      const uint64_t in_piece = (to_piece_end - range.width) / range.src_pitch + 1;
      const uint64_t rows = std::min({range.rows - row, in_piece, chunk_bytes_ / range.width});
      RETURN_IF_ERROR(device_.CopyAsync2D(stream, to, range.dst_pitch, from, range.src_pitch,
                                          range.width, rows));
      row += rows;
    }
  }
  return absl::OkStatus();
}

}  // namespace tierd
