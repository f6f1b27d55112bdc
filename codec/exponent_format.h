// The compressed form of a weight object: the exponent-codebook format, version 1.
//
// Floats from trained or initialised networks use few of their exponents: a Gaussian-initialised
// bf16 tensor has ~2.6 bits of exponent entropy in an 8-bit field. The format splits each 16-bit
// word into its exponent and the rest (sign and mantissa), keeps the rest as it is, and codes the
// exponent with a fixed-width code of `code_bits` bits: codes 0 .. 2^bits - 2 name the most
// frequent exponents (the codebook), the last code is an escape whose exponent comes from the
// escape stream, in order. A word is one bf16 or fp16 value, or two FP8 values (e4m3 or e5m2) whose
// two exponents are coded together as one 8-bit symbol. Any byte string of any length round-trips
// bit for bit in every layout: NaNs, infinities, subnormals, negative zero, and bytes that are not
// floats at all (they just escape).
//
// The words are cut into tiles of kTileWords (4 KiB of output), each decoded independently by one
// GPU block of kTileThreads threads, 8 words a thread. A tile records where its escapes start in
// the escape stream and a checksum of its decoded bytes, so a decoder checks what it produced, and
// a run of tiles can be decoded with the tables of that run alone (TileTables).
//
// Layout, little-endian, every section 16-byte aligned:
//   [Header: 128 bytes]
//   [tile checksums: u32 × tiles]                 TileChecksum() of each tile's decoded words
//   [escape starts: u32 × (tiles + 1)]            tile t's escapes are [start[t], start[t+1])
//   [escape stream: `escapes` bytes]              one exponent per escaped word, in word order
//   [tile data: tile_bytes × tiles]               per tile: codes, rest, side (below)
// A tile's data: codes (code_bits bytes per 8 words: word k of the group at bits [k*b, k*b+b) of
// the little-endian group), rest (one byte per word), and for fp16 side (3 bits per word, packed as
// the codes are). Words past the last are padding: code 0, rest 0, side 0; never escapes.
//
// This header is plain C++ shared by the CPU codec and the CUDA decoder.
#ifndef TIERD_CODEC_EXPONENT_FORMAT_H_
#define TIERD_CODEC_EXPONENT_FORMAT_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TIERD_HOST_DEVICE __host__ __device__
#else
#define TIERD_HOST_DEVICE
#endif

namespace tierd::codec {

inline constexpr uint32_t kMagic = 0x315a4454;  // "TDZ1"
inline constexpr uint8_t kVersion = 1;
inline constexpr uint32_t kHeaderBytes = 128;
inline constexpr uint32_t kGroupWords = 8;
inline constexpr uint32_t kTileThreads = 256;
inline constexpr uint32_t kTileWords = kGroupWords * kTileThreads;  // 2048 words, 4 KiB
inline constexpr uint32_t kMinCodeBits = 1;
inline constexpr uint32_t kMaxCodeBits = 5;
inline constexpr uint32_t kCodebookBytes = 32;
// A compressed object has fewer than 2^32 words (8 GiB): escape starts are 32-bit.
inline constexpr uint64_t kMaxWords = (uint64_t{1} << 32) - kTileWords;

// How a 16-bit little-endian word splits into exponent, rest (8 bits) and side bits. In kFp8Pair
// the word is two values, `lo` (the first byte) and `hi` (the second).
enum class WordLayout : uint8_t {
  kBf16 = 1,  // s eeeeeeee mmmmmmm: exponent 8 bits; rest = sign and mantissa; no side bits
  kFp16 = 2,  // s eeeee mmmmmmmmmm: exponent 5 bits; rest = mantissa's low 8 bits; side = s, m9, m8
  // Two FP8 values, each s xxxx yyy: exponent = hi's xxxx << 4 | lo's; rest = hi's s yyy << 4 |
  // lo's; no side bits. For e4m3 (s eeee mmm) xxxx is the exponent. For e5m2 (s eeeee mm) it is
  // the exponent less its lowest bit, which stays in the rest: of an e5m2 exponent's bits that is
  // the one least skewed, and the pair's symbol stays a byte.
  kFp8Pair = 3,
};
inline constexpr WordLayout kWordLayouts[] = {WordLayout::kBf16, WordLayout::kFp16,
                                              WordLayout::kFp8Pair};
constexpr bool IsWordLayout(uint32_t value) {
  for (const WordLayout layout : kWordLayouts) {
    if (static_cast<uint32_t>(layout) == value) return true;
  }
  return false;
}
constexpr const char* WordLayoutName(WordLayout layout) {
  switch (layout) {
    case WordLayout::kBf16:
      return "bf16";
    case WordLayout::kFp16:
      return "fp16";
    case WordLayout::kFp8Pair:
      return "fp8 pairs";
  }
  return "unknown";
}

TIERD_HOST_DEVICE constexpr uint32_t SideBits(WordLayout layout) {
  return layout == WordLayout::kFp16 ? 3 : 0;
}
TIERD_HOST_DEVICE constexpr uint32_t ExponentLimit(WordLayout layout) {
  return layout == WordLayout::kFp16 ? 32 : 256;
}
TIERD_HOST_DEVICE constexpr uint32_t Exponent(WordLayout layout, uint16_t word) {
  switch (layout) {
    case WordLayout::kFp16:
      return (word >> 10) & 0x1f;
    case WordLayout::kFp8Pair:
      return ((word >> 7) & 0xf0) | ((word >> 3) & 0x0f);
    default:
      return (word >> 7) & 0xff;
  }
}
TIERD_HOST_DEVICE constexpr uint32_t Rest(WordLayout layout, uint16_t word) {
  switch (layout) {
    case WordLayout::kFp16:
      return word & 0xff;
    case WordLayout::kFp8Pair:  // s yyy of each: bits 15, 10..8 and 7, 2..0
      return ((word >> 8) & 0x80) | ((word >> 4) & 0x70) | ((word >> 4) & 0x08) | (word & 0x07);
    default:
      return ((word >> 8) & 0x80) | (word & 0x7f);
  }
}
TIERD_HOST_DEVICE constexpr uint32_t Side(WordLayout layout, uint16_t word) {
  return layout == WordLayout::kFp16 ? ((word >> 13) & 0x4) | ((word >> 8) & 0x3) : 0;
}
TIERD_HOST_DEVICE constexpr uint16_t JoinWord(WordLayout layout, uint32_t exponent, uint32_t rest,
                                              uint32_t side) {
  switch (layout) {
    case WordLayout::kFp16:
      return static_cast<uint16_t>(((side & 0x4) << 13) | ((exponent & 0x1f) << 10) |
                                   ((side & 0x3) << 8) | (rest & 0xff));
    case WordLayout::kFp8Pair:
      return static_cast<uint16_t>(((rest & 0x80) << 8) | ((exponent & 0xf0) << 7) |
                                   ((rest & 0x70) << 4) | ((rest & 0x08) << 4) |
                                   ((exponent & 0x0f) << 3) | (rest & 0x07));
    default:
      return static_cast<uint16_t>(((rest & 0x80) << 8) | ((exponent & 0xff) << 7) |
                                   (rest & 0x7f));
  }
}

// The tile checksum: over the tile's words as 64-bit lanes (4 words each, little-endian; padding
// words count as zero), the sum of Mix64(lane ^ lane_index * kLaneSalt) folded to 32 bits. A sum,
// so a GPU block reduces it in any order; salted by the lane's index in the object, so words that
// trade places do not cancel.
inline constexpr uint64_t kLaneSalt = 0x9e3779b97f4a7c15ull;
TIERD_HOST_DEVICE inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
TIERD_HOST_DEVICE inline uint64_t LaneTerm(uint64_t lane, uint64_t lane_index) {
  return Mix64(lane ^ (lane_index * kLaneSalt));
}
TIERD_HOST_DEVICE inline uint32_t FoldChecksum(uint64_t sum) {
  return static_cast<uint32_t>(sum ^ (sum >> 32));
}

// The first 128 bytes of a compressed object.
struct Header {
  uint32_t magic;
  uint8_t version;
  uint8_t layout;     // WordLayout
  uint8_t code_bits;  // kMinCodeBits .. kMaxCodeBits
  uint8_t tail_size;  // 1 when the object has an odd byte count: its last byte, kept here
  uint8_t tail_byte;
  uint8_t reserved0[7];
  uint64_t raw_bytes;                // the object's size
  uint64_t escapes;                  // bytes in the escape stream
  uint64_t encoded_bytes;            // this compressed object's size
  uint8_t codebook[kCodebookBytes];  // code k < 2^code_bits - 1 → exponent codebook[k]
  uint8_t reserved1[56];
};
static_assert(sizeof(Header) == kHeaderBytes, "the header is 128 bytes");

// Where everything is, derived from a header's fields (see ParseCompressed in exponent_codec.h,
// which checks them). Plain data, passed by value to the GPU decoder.
struct CompressedLayout {
  WordLayout layout;
  uint32_t code_bits;
  uint32_t tail_size;
  uint32_t tail_byte;
  uint64_t raw_bytes;
  uint64_t words;  // (raw_bytes - tail_size) / 2
  uint64_t tiles;
  uint64_t escapes;
  uint64_t tile_bytes;
  uint64_t checksums_offset;
  uint64_t escape_starts_offset;
  uint64_t escapes_offset;
  uint64_t data_offset;  // tile t's data at data_offset + t * tile_bytes
  uint64_t encoded_bytes;
  uint8_t codebook[kCodebookBytes];
};

TIERD_HOST_DEVICE inline uint64_t AlignUp16(uint64_t n) { return (n + 15) & ~uint64_t{15}; }

TIERD_HOST_DEVICE inline uint64_t TileBytes(WordLayout layout, uint32_t code_bits) {
  return uint64_t{kTileThreads} * (code_bits + SideBits(layout)) + kTileWords;
}

// Fills the offsets of `out` from its layout, code_bits, raw_bytes, tail_size and escapes.
TIERD_HOST_DEVICE inline void ComputeOffsets(CompressedLayout& out) {
  out.words = (out.raw_bytes - out.tail_size) / 2;
  out.tiles = (out.words + kTileWords - 1) / kTileWords;
  out.tile_bytes = TileBytes(out.layout, out.code_bits);
  out.checksums_offset = kHeaderBytes;
  out.escape_starts_offset = AlignUp16(out.checksums_offset + 4 * out.tiles);
  out.escapes_offset = AlignUp16(out.escape_starts_offset + 4 * (out.tiles + 1));
  out.data_offset = AlignUp16(out.escapes_offset + out.escapes);
  out.encoded_bytes = out.data_offset + out.tiles * out.tile_bytes;
}

// What a decoder reads of the tables for tiles [first_tile, first_tile + n): their checksums,
// their escape starts (n + 1: the last is where the run's escapes end) and the escapes those
// starts name — escape e of the object's stream at escapes[e - escapes_base], for e in
// [escapes_base, escapes_base + escapes_count). A decoder reads no escape outside that range,
// whatever the starts say. The tables may lie in the object's whole prefix (TablesInPrefix) or be a
// run's own, copied apart: a GPU decode keeps only the run's, so an object's tables need not fit
// in its scratch area. In the copied form each part starts 16-byte aligned, checksums first — for
// the whole object, the layout of the prefix after its header.
struct TileTables {
  const uint32_t* checksums;      // checksums[i]: tile first_tile + i's
  const uint32_t* escape_starts;  // escape_starts[i]: where tile first_tile + i's escapes start
  const uint8_t* escapes;
  uint64_t escapes_base;
  uint64_t escapes_count;
};

// The tables of tiles from `first_tile` on, in the object's whole prefix at `prefix`.
TIERD_HOST_DEVICE inline TileTables TablesInPrefix(const CompressedLayout& layout,
                                                   const uint8_t* prefix, uint64_t first_tile) {
  return TileTables{
      reinterpret_cast<const uint32_t*>(prefix + layout.checksums_offset) + first_tile,
      reinterpret_cast<const uint32_t*>(prefix + layout.escape_starts_offset) + first_tile,
      prefix + layout.escapes_offset, 0, layout.escapes};
}

// The bytes the copied tables of `tiles` tiles with `escapes` escapes take (TileTables).
TIERD_HOST_DEVICE inline uint64_t CopiedTablesBytes(uint64_t tiles, uint64_t escapes) {
  return AlignUp16(4 * tiles) + AlignUp16(4 * (tiles + 1)) + AlignUp16(escapes);
}

}  // namespace tierd::codec

#endif  // TIERD_CODEC_EXPONENT_FORMAT_H_
