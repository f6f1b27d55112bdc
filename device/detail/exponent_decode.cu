#include "device/detail/exponent_decode.h"

namespace tierd {
namespace {

using codec::CompressedLayout;
using codec::TileTables;
using codec::kGroupWords;
using codec::kTileThreads;
using codec::kTileWords;
using codec::WordLayout;

constexpr uint32_t kTilesPerBlock = 8;  // one warp a tile
constexpr uint32_t kBlockThreads = 32 * kTilesPerBlock;
constexpr uint32_t kRounds = kTileThreads / 32;  // a lane decodes 8 words a round
constexpr uint32_t kAllLanes = 0xffffffffu;

// The little-endian packed fields of a group's 8 words at kBits bits a word.
template <uint32_t kBits>
__device__ uint64_t PackedGroup(const uint8_t* group) {
  uint64_t packed = 0;
#pragma unroll
  for (uint32_t i = 0; i < kBits; ++i) packed |= uint64_t{group[i]} << (8 * i);
  return packed;
}

// One warp decodes one tile: its 256 groups in kRounds rounds of 32, lane l taking group
// round * 32 + l, so that loads and stores of a round are contiguous across the warp. The loads of
// every round are issued before any is used; escapes are numbered by a warp scan carried across
// rounds. No shared memory, no block-wide barrier: the warps of a block are independent tiles.
template <uint32_t kBits, WordLayout kLayout>
__global__ void __launch_bounds__(kBlockThreads)
    DecodeTilesKernel(CompressedLayout layout, TileTables tables,
                      const uint8_t* __restrict__ tiles, uint8_t* __restrict__ dst,
                      uint64_t first_tile, uint64_t tile_count, uint32_t* verdict) {
  constexpr uint32_t kSideBits = codec::SideBits(kLayout);
  constexpr uint32_t kEscapeCode = (1u << kBits) - 1;
  constexpr uint32_t kLimit = codec::ExponentLimit(kLayout);
  const uint32_t lane = threadIdx.x % 32;
  if (blockIdx.x == 0 && threadIdx.x == 0 && layout.tail_size == 1 &&
      first_tile + tile_count == layout.tiles) {
    dst[layout.raw_bytes - 1] = static_cast<uint8_t>(layout.tail_byte);
  }
  const uint64_t index = uint64_t{blockIdx.x} * kTilesPerBlock + threadIdx.x / 32;
  if (index >= tile_count) return;  // whole warps leave together
  const uint64_t tile = first_tile + index;
  const uint8_t* data = tiles + index * layout.tile_bytes;
  const uint8_t* rest_bytes = data + kTileThreads * kBits;
  const uint8_t* side_bytes = rest_bytes + kTileWords;

  const uint32_t* __restrict__ starts = tables.escape_starts;
  uint64_t begin = starts[index];
  uint64_t end = starts[index + 1];
  const uint32_t expected = tables.checksums[index];
  uint64_t codes[kRounds];
  uint64_t rests[kRounds];
  uint64_t sides[kRounds];
#pragma unroll
  for (uint32_t round = 0; round < kRounds; ++round) {
    const uint32_t group = round * 32 + lane;
    codes[round] = PackedGroup<kBits>(data + group * kBits);
    rests[round] = reinterpret_cast<const uint64_t*>(rest_bytes)[group];
    sides[round] = 0;
    if constexpr (kSideBits != 0)
      sides[round] = PackedGroup<kSideBits>(side_bytes + group * kSideBits);
  }
  bool bad = false;
  if (end < begin || end - begin > kTileWords || begin < tables.escapes_base ||
      end - tables.escapes_base > tables.escapes_count) {
    bad = true;
    begin = end = 0;
  } else {  // counted from the tables' first escape from here on
    begin -= tables.escapes_base;
    end -= tables.escapes_base;
  }
  uint32_t codebook_entry = 0;  // read with constant indices: the parameters stay off the stack
#pragma unroll
  for (uint32_t c = 0; c < 32; ++c) {
    if (lane == c) codebook_entry = layout.codebook[c];
  }
  const uint8_t* __restrict__ escapes = tables.escapes;
  uint64_t next_round_escape = begin;
  uint64_t sum = 0;
#pragma unroll
  for (uint32_t round = 0; round < kRounds; ++round) {
    uint32_t mine = 0;
#pragma unroll
    for (uint32_t k = 0; k < kGroupWords; ++k) {
      mine += ((codes[round] >> (k * kBits)) & kEscapeCode) == kEscapeCode;
    }
    uint32_t inclusive = mine;
#pragma unroll
    for (uint32_t offset = 1; offset < 32; offset *= 2) {
      const uint32_t other = __shfl_up_sync(kAllLanes, inclusive, offset);
      if (lane >= offset) inclusive += other;
    }
    uint64_t next_escape = next_round_escape + inclusive - mine;
    next_round_escape += __shfl_sync(kAllLanes, inclusive, 31);

    uint32_t out[kGroupWords / 2];
#pragma unroll
    for (uint32_t k = 0; k < kGroupWords; ++k) {
      const uint32_t code = static_cast<uint32_t>(codes[round] >> (k * kBits)) & kEscapeCode;
      // Lane c holds codebook entry c: a shuffle looks a code up without touching memory.
      uint32_t exponent = __shfl_sync(kAllLanes, codebook_entry, code);
      if (code == kEscapeCode) {
        if (next_escape < end) {
          exponent = escapes[next_escape++];
          if (exponent >= kLimit) bad = true;
        } else {
          bad = true;
        }
      }
      const uint32_t rest = static_cast<uint32_t>(rests[round] >> (8 * k)) & 0xff;
      const uint32_t side = static_cast<uint32_t>(sides[round] >> (k * kSideBits)) & 0x7;
      const uint32_t word = codec::JoinWord(kLayout, exponent, rest, side);
      out[k / 2] = k % 2 == 0 ? word : out[k / 2] | (word << 16);
    }

    const uint64_t first_word = tile * kTileWords + uint64_t{round * 32 + lane} * kGroupWords;
    uint8_t* target = dst + 2 * first_word;
    if (first_word + kGroupWords <= layout.words) {
      if ((reinterpret_cast<uintptr_t>(target) & 15) == 0) {
        *reinterpret_cast<uint4*>(target) = make_uint4(out[0], out[1], out[2], out[3]);
      } else {
        for (uint32_t b = 0; b < 2 * kGroupWords; ++b) target[b] = out[b / 4] >> (8 * (b % 4));
      }
    } else {
      // The last group: padding words are neither written nor counted in the checksum.
      for (uint32_t k = 0; k < kGroupWords; ++k) {
        if (first_word + k < layout.words) {
          target[2 * k] = out[k / 2] >> (16 * (k % 2));
          target[2 * k + 1] = out[k / 2] >> (16 * (k % 2) + 8);
        } else {
          out[k / 2] &= k % 2 == 0 ? 0xffff0000u : 0x0000ffffu;
        }
      }
    }
    const uint64_t lane_index = first_word / 4;
    sum += codec::LaneTerm(out[0] | (uint64_t{out[1]} << 32), lane_index) +
           codec::LaneTerm(out[2] | (uint64_t{out[3]} << 32), lane_index + 1);
  }
  if (next_round_escape != end) bad = true;
#pragma unroll
  for (uint32_t offset = 16; offset > 0; offset /= 2)
    sum += __shfl_down_sync(kAllLanes, sum, offset);
  if (lane == 0 && codec::FoldChecksum(sum) != expected) bad = true;
  if (bad) *reinterpret_cast<volatile uint32_t*>(verdict) = 1;
}

template <WordLayout kLayout>
cudaError_t Launch(const CompressedLayout& layout, const TileTables& tables, const uint8_t* tiles,
                   uint8_t* dst, uint64_t first_tile, uint64_t tile_count, uint32_t* verdict,
                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(
      tile_count > 0 ? (tile_count + kTilesPerBlock - 1) / kTilesPerBlock : 1));
  switch (layout.code_bits) {
#define TIERD_DECODE_CASE(bits)                                           \
  case bits:                                                              \
    DecodeTilesKernel<bits, kLayout><<<grid, kBlockThreads, 0, stream>>>( \
        layout, tables, tiles, dst, first_tile, tile_count, verdict);     \
    break;
    TIERD_DECODE_CASE(1)
    TIERD_DECODE_CASE(2)
    TIERD_DECODE_CASE(3)
    TIERD_DECODE_CASE(4)
    TIERD_DECODE_CASE(5)
#undef TIERD_DECODE_CASE
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchExponentDecode(const CompressedLayout& layout, const TileTables& tables,
                                 const void* tiles, void* dst, uint64_t first_tile,
                                 uint64_t tile_count, uint32_t* verdict, cudaStream_t stream) {
  if (first_tile > layout.tiles || tile_count > layout.tiles - first_tile ||
      tile_count > 0x7fffffffu) {
    return cudaErrorInvalidValue;
  }
  const auto* data = static_cast<const uint8_t*>(tiles);
  auto* out = static_cast<uint8_t*>(dst);
  switch (layout.layout) {
    case WordLayout::kBf16:
      return Launch<WordLayout::kBf16>(layout, tables, data, out, first_tile, tile_count, verdict,
                                       stream);
    case WordLayout::kFp16:
      return Launch<WordLayout::kFp16>(layout, tables, data, out, first_tile, tile_count, verdict,
                                       stream);
    case WordLayout::kFp8Pair:
      return Launch<WordLayout::kFp8Pair>(layout, tables, data, out, first_tile, tile_count,
                                          verdict, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace tierd
