// The CPU side of the exponent-codebook format (exponent_format.h): planning and encoding a weight
// object, checking a compressed one, and decoding it. The host backend decodes with it, so every
// path that serves compressed objects runs on a machine without a GPU; the CUDA decoder
// (device/detail/exponent_decode.cu) produces the same bytes and checks the same things.
//
// Stateless; thread-safe.
#ifndef TIERD_CODEC_EXPONENT_CODEC_H_
#define TIERD_CODEC_EXPONENT_CODEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/exponent_format.h"

namespace tierd::codec {

struct EncodingOptions {
  // Objects smaller than this stay raw: the tables and a copy's fixed cost outweigh the bytes.
  uint64_t min_bytes = 64 * 1024;
  // An object whose compressed form would be larger than this fraction of it stays raw: the bytes
  // saved would not pay for the decode (random bytes, int8 weights, fp32 mantissas).
  double max_ratio = 0.9;
};

// What encoding an object would give, found by one pass over it: the smallest of the word layouts
// (bf16, fp16, FP8 pairs), each at its best code width. The bytes' dtype is not asked
// for: whichever layout codes them smallest is the one, and ties go to the layout listed first.
struct EncodingPlan {
  bool compress = false;  // false: keep the object raw; `reason` says why
  std::string reason;
  WordLayout layout = WordLayout::kBf16;
  uint32_t code_bits = 0;
  uint64_t raw_bytes = 0;
  uint64_t escapes = 0;
  uint64_t encoded_bytes = 0;  // what Encode writes
  uint8_t codebook[kCodebookBytes] = {};

  double ratio() const {
    return raw_bytes == 0 ? 1.0 : static_cast<double>(encoded_bytes) / raw_bytes;
  }
};

EncodingPlan PlanEncoding(const uint8_t* raw, uint64_t size, const EncodingOptions& options = {});

// Writes the compressed form of `raw` (`size` bytes) that `plan` describes into `dst`, which has
// room for plan.encoded_bytes. Errors: FAILED_PRECONDITION when `plan` is not a plan to compress
// these bytes (made for another size, or not to compress); DATA_LOSS when the bytes no longer
// match the plan (they changed since it was made).
absl::Status Encode(const uint8_t* raw, uint64_t size, const EncodingPlan& plan, uint8_t* dst);

// Checks the header of the compressed object at `data` (`size` bytes: the whole object, or at
// least what comes before its first tile's data: header, tables and escapes) and returns where
// everything is. Errors: DATA_LOSS naming the first field that is wrong (magic, version, layout,
// code width, a size that disagrees).
absl::StatusOr<CompressedLayout> ParseCompressedHeader(const uint8_t* data, uint64_t size);

// ParseCompressedHeader, then checks the whole object: `size` is exactly its encoded size, every
// code names an exponent the layout has, and the escape starts rise from 0 to the escape count by
// at most a tile's words. A decoder still checks each tile it decodes (the bytes may change under
// it); this tells a corrupted object from a good one before any of it is used.
absl::StatusOr<CompressedLayout> ParseCompressed(const uint8_t* data, uint64_t size);

// The escapes of tiles [first_tile, first_tile + tile_count) of the object whose prefix (at least)
// is at `prefix`, as far as its escape starts can be believed: within the escape stream, and at
// most a tile's words a tile. What a decoder given only those tiles' tables copies of the escape
// stream (TileTables::escapes_base and escapes_count): it checks each tile's range against this
// one, so starts that lie fail the decode and never make it read past what was copied.
// REQUIRES: the tiles are within layout.tiles.
struct EscapeRange {
  uint64_t base;
  uint64_t count;
};
EscapeRange EscapesOfTiles(const CompressedLayout& layout, const uint8_t* prefix,
                           uint64_t first_tile, uint64_t tile_count);

// Decodes tiles [first_tile, first_tile + tile_count) of an object described by `layout` (as
// ParseCompressedHeader returned it) into `dst`, the object's raw bytes; the tail byte too when
// the range ends at the last tile. `tables` are those tiles' tables (TablesInPrefix for an object
// whose whole prefix is at hand); `tiles` the data of those tiles, first_tile's first — so a
// decoder can take an object in pieces. Checks each tile's escape range and checksum. Errors:
// OUT_OF_RANGE for tiles past the end; DATA_LOSS naming the tile whose escapes or checksum
// disagree (what was written of it is not the object's bytes).
absl::Status DecodeTiles(const CompressedLayout& layout, const TileTables& tables,
                         const uint8_t* tiles, uint8_t* dst, uint64_t first_tile,
                         uint64_t tile_count);

// The data of tile `tile` of the whole compressed object at `src`.
inline const uint8_t* TileData(const CompressedLayout& layout, const uint8_t* src, uint64_t tile) {
  return src + layout.data_offset + tile * layout.tile_bytes;
}

// Decodes the whole object at `src`: DecodeTiles over every tile.
inline absl::Status Decode(const CompressedLayout& layout, const uint8_t* src, uint8_t* dst) {
  return DecodeTiles(layout, TablesInPrefix(layout, src, 0), TileData(layout, src, 0), dst, 0,
                     layout.tiles);
}

}  // namespace tierd::codec

#endif  // TIERD_CODEC_EXPONENT_CODEC_H_
