#include "codec/exponent_codec.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace tierd::codec {
namespace {

uint16_t LoadWord(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
uint32_t LoadU32(const uint32_t* p) { return LoadU32(reinterpret_cast<const uint8_t*>(p)); }
void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, sizeof(v)); }

// The little-endian packed fields of a group's 8 words at `bits` bits a word: word k's at bits
// [k * bits, k * bits + bits).
uint64_t PackedGroup(const uint8_t* group, uint32_t bits) {
  uint64_t packed = 0;
  for (uint32_t i = 0; i < bits; ++i) packed |= uint64_t{group[i]} << (8 * i);
  return packed;
}
void StorePacked(uint8_t* group, uint32_t bits, const uint32_t (&fields)[kGroupWords]) {
  uint64_t packed = 0;
  for (uint32_t k = 0; k < kGroupWords; ++k) packed |= uint64_t{fields[k]} << (k * bits);
  for (uint32_t i = 0; i < bits; ++i) group[i] = static_cast<uint8_t>(packed >> (8 * i));
}

// The 64-bit lane `lane_index` of the object's words (padding words zero).
uint64_t Lane(const uint16_t (&words)[kGroupWords], uint32_t half) {
  uint64_t lane = 0;
  for (uint32_t k = 0; k < 4; ++k) lane |= uint64_t{words[4 * half + k]} << (16 * k);
  return lane;
}

CompressedLayout LayoutFor(WordLayout word_layout, uint32_t code_bits, uint64_t raw_bytes,
                           uint64_t escapes) {
  CompressedLayout layout{};
  layout.layout = word_layout;
  layout.code_bits = code_bits;
  layout.tail_size = raw_bytes % 2;
  layout.raw_bytes = raw_bytes;
  layout.escapes = escapes;
  ComputeOffsets(layout);
  return layout;
}

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("compressed object: ", what));
}

}  // namespace

EncodingPlan PlanEncoding(const uint8_t* raw, uint64_t size, const EncodingOptions& options) {
  EncodingPlan plan;
  plan.raw_bytes = size;
  plan.encoded_bytes = size;
  if (size < options.min_bytes || size < 2) {
    plan.reason = absl::StrCat("smaller than ", options.min_bytes, " bytes");
    return plan;
  }
  const uint64_t words = size / 2;
  if (words > kMaxWords) {
    plan.reason = "larger than the format's 8 GiB";
    return plan;
  }
  // Each layout's exponent histogram, in one pass over the words.
  constexpr size_t kLayoutCount = std::size(kWordLayouts);
  static_assert(kLayoutCount == 3, "count every layout's exponents below");
  std::array<std::array<uint64_t, 256>, kLayoutCount> histograms{};
  for (uint64_t i = 0; i < words; ++i) {
    const uint16_t word = LoadWord(raw + 2 * i);
    ++histograms[0][Exponent(kWordLayouts[0], word)];
    ++histograms[1][Exponent(kWordLayouts[1], word)];
    ++histograms[2][Exponent(kWordLayouts[2], word)];
  }
  for (size_t l = 0; l < kLayoutCount; ++l) {
    const WordLayout word_layout = kWordLayouts[l];
    const uint32_t limit = ExponentLimit(word_layout);
    const uint64_t* counts = histograms[l].data();
    std::array<uint32_t, 256> order;
    std::iota(order.begin(), order.begin() + limit, 0);
    // Most frequent first; equal counts by exponent, so a plan is a function of the bytes.
    std::stable_sort(order.begin(), order.begin() + limit,
                     [&](uint32_t a, uint32_t b) { return counts[a] > counts[b]; });
    for (uint32_t bits = kMinCodeBits; bits <= kMaxCodeBits; ++bits) {
      const uint32_t named = std::min((1u << bits) - 1, limit);
      uint64_t covered = 0;
      for (uint32_t k = 0; k < named; ++k) covered += counts[order[k]];
      const CompressedLayout layout = LayoutFor(word_layout, bits, size, words - covered);
      if (plan.code_bits != 0 && layout.encoded_bytes >= plan.encoded_bytes) continue;
      plan.layout = word_layout;
      plan.code_bits = bits;
      plan.escapes = layout.escapes;
      plan.encoded_bytes = layout.encoded_bytes;
      std::memset(plan.codebook, 0, sizeof(plan.codebook));
      for (uint32_t k = 0; k < named; ++k) plan.codebook[k] = static_cast<uint8_t>(order[k]);
    }
  }
  if (plan.ratio() > options.max_ratio) {
    plan.reason = absl::StrFormat("compresses only to %.3f of its size", plan.ratio());
    plan.encoded_bytes = size;
    return plan;
  }
  plan.compress = true;
  return plan;
}

absl::Status Encode(const uint8_t* raw, uint64_t size, const EncodingPlan& plan, uint8_t* dst) {
  if (!plan.compress || plan.raw_bytes != size) {
    return absl::FailedPreconditionError(
        absl::StrCat("no plan to compress ", size, " bytes (the plan is for ", plan.raw_bytes,
                     plan.compress ? "" : ", to keep them raw", ")"));
  }
  const CompressedLayout layout = LayoutFor(plan.layout, plan.code_bits, size, plan.escapes);
  const uint32_t bits = layout.code_bits;
  const uint32_t escape_code = (1u << bits) - 1;
  const uint32_t side_bits = SideBits(layout.layout);
  std::array<uint32_t, 256> code_of;
  code_of.fill(escape_code);
  for (uint32_t k = 0; k < escape_code && k < ExponentLimit(layout.layout); ++k) {
    code_of[plan.codebook[k]] = k;
  }

  std::memset(dst, 0, layout.data_offset);
  Header header{};
  header.magic = kMagic;
  header.version = kVersion;
  header.layout = static_cast<uint8_t>(layout.layout);
  header.code_bits = static_cast<uint8_t>(bits);
  header.tail_size = static_cast<uint8_t>(layout.tail_size);
  header.tail_byte = layout.tail_size ? raw[size - 1] : 0;
  header.raw_bytes = size;
  header.escapes = layout.escapes;
  header.encoded_bytes = layout.encoded_bytes;
  std::memcpy(header.codebook, plan.codebook, sizeof(header.codebook));
  std::memcpy(dst, &header, sizeof(header));

  uint64_t escapes = 0;
  for (uint64_t tile = 0; tile < layout.tiles; ++tile) {
    StoreU32(dst + layout.escape_starts_offset + 4 * tile, static_cast<uint32_t>(escapes));
    uint8_t* data = dst + layout.data_offset + tile * layout.tile_bytes;
    uint8_t* codes = data;
    uint8_t* rest = data + kTileThreads * bits;
    uint8_t* side = rest + kTileWords;
    uint64_t sum = 0;
    for (uint32_t group = 0; group < kTileThreads; ++group) {
      const uint64_t first_word = tile * kTileWords + group * kGroupWords;
      uint16_t words[kGroupWords] = {};
      uint32_t code_fields[kGroupWords] = {};
      uint32_t side_fields[kGroupWords] = {};
      for (uint32_t k = 0; k < kGroupWords; ++k) {
        const uint64_t w = first_word + k;
        if (w >= layout.words) break;  // padding: code 0, rest 0, side 0
        const uint16_t word = LoadWord(raw + 2 * w);
        words[k] = word;
        const uint32_t exponent = Exponent(layout.layout, word);
        code_fields[k] = code_of[exponent];
        if (code_fields[k] == escape_code) {
          if (escapes == layout.escapes)
            return Corrupt("the bytes changed since they were planned");
          dst[layout.escapes_offset + escapes++] = static_cast<uint8_t>(exponent);
        }
        rest[group * kGroupWords + k] = static_cast<uint8_t>(Rest(layout.layout, word));
        side_fields[k] = Side(layout.layout, word);
      }
      StorePacked(codes + group * bits, bits, code_fields);
      if (side_bits != 0) StorePacked(side + group * side_bits, side_bits, side_fields);
      sum +=
          LaneTerm(Lane(words, 0), first_word / 4) + LaneTerm(Lane(words, 1), first_word / 4 + 1);
    }
    StoreU32(dst + layout.checksums_offset + 4 * tile, FoldChecksum(sum));
  }
  if (escapes != layout.escapes) return Corrupt("the bytes changed since they were planned");
  StoreU32(dst + layout.escape_starts_offset + 4 * layout.tiles, static_cast<uint32_t>(escapes));
  return absl::OkStatus();
}

absl::StatusOr<CompressedLayout> ParseCompressedHeader(const uint8_t* data, uint64_t size) {
  if (size < kHeaderBytes) return Corrupt(absl::StrCat(size, " bytes: no room for the header"));
  Header header;
  std::memcpy(&header, data, sizeof(header));
  if (header.magic != kMagic) return Corrupt("bad magic");
  if (header.version != kVersion) return Corrupt(absl::StrCat("version ", header.version));
  if (!IsWordLayout(header.layout)) {
    return Corrupt(absl::StrCat("word layout ", header.layout));
  }
  if (header.code_bits < kMinCodeBits || header.code_bits > kMaxCodeBits) {
    return Corrupt(absl::StrCat("code width ", header.code_bits));
  }
  if (header.tail_size > 1 || header.raw_bytes < header.tail_size ||
      header.tail_size != header.raw_bytes % 2) {
    return Corrupt(absl::StrCat("tail of ", header.tail_size, " for ", header.raw_bytes, " bytes"));
  }
  if (header.raw_bytes / 2 > kMaxWords) {
    return Corrupt(absl::StrCat(header.raw_bytes, " bytes: larger than the format allows"));
  }
  CompressedLayout layout{};
  layout.layout = static_cast<WordLayout>(header.layout);
  layout.code_bits = header.code_bits;
  layout.tail_size = header.tail_size;
  layout.tail_byte = header.tail_byte;
  layout.raw_bytes = header.raw_bytes;
  layout.escapes = header.escapes;
  const uint64_t max_escapes = (header.raw_bytes / 2 + kTileWords - 1) / kTileWords * kTileWords;
  if (header.escapes > max_escapes) {
    return Corrupt(absl::StrCat(header.escapes, " escapes for ", header.raw_bytes / 2, " words"));
  }
  ComputeOffsets(layout);
  if (header.encoded_bytes != layout.encoded_bytes) {
    return Corrupt(absl::StrCat("encoded size ", header.encoded_bytes, ", its fields make ",
                                layout.encoded_bytes));
  }
  const uint32_t named = std::min((1u << layout.code_bits) - 1, ExponentLimit(layout.layout));
  for (uint32_t k = 0; k < named; ++k) {
    if (header.codebook[k] >= ExponentLimit(layout.layout)) {
      return Corrupt(absl::StrCat("code ", k, " names exponent ", header.codebook[k]));
    }
  }
  std::memcpy(layout.codebook, header.codebook, sizeof(layout.codebook));
  if (size < layout.data_offset && size != layout.encoded_bytes) {
    return Corrupt(
        absl::StrCat(size, " bytes: shorter than its tables (", layout.data_offset, ")"));
  }
  return layout;
}

absl::StatusOr<CompressedLayout> ParseCompressed(const uint8_t* data, uint64_t size) {
  ASSIGN_OR_RETURN(const CompressedLayout layout, ParseCompressedHeader(data, size));
  if (size != layout.encoded_bytes) {
    return Corrupt(absl::StrCat(size, " bytes where its header says ", layout.encoded_bytes));
  }
  uint32_t previous = LoadU32(data + layout.escape_starts_offset);
  if (previous != 0) return Corrupt("the first tile's escapes do not start at 0");
  for (uint64_t tile = 1; tile <= layout.tiles; ++tile) {
    const uint32_t start = LoadU32(data + layout.escape_starts_offset + 4 * tile);
    if (start < previous || start - previous > kTileWords) {
      return Corrupt(absl::StrCat("escape starts of tile ", tile - 1, ": ", previous, ", ", start));
    }
    previous = start;
  }
  if (previous != layout.escapes) {
    return Corrupt(absl::StrCat("escape starts end at ", previous, " of ", layout.escapes));
  }
  return layout;
}

EscapeRange EscapesOfTiles(const CompressedLayout& layout, const uint8_t* prefix,
                           uint64_t first_tile, uint64_t tile_count) {
  const auto start = [&](uint64_t tile) {
    return std::min<uint64_t>(LoadU32(prefix + layout.escape_starts_offset + 4 * tile),
                              layout.escapes);
  };
  const uint64_t begin = start(first_tile);
  const uint64_t end = start(first_tile + tile_count);
  return {begin, end > begin ? std::min(end - begin, tile_count * kTileWords) : 0};
}

absl::Status DecodeTiles(const CompressedLayout& layout, const TileTables& tables,
                         const uint8_t* tiles, uint8_t* dst, uint64_t first_tile,
                         uint64_t tile_count) {
  if (first_tile > layout.tiles || tile_count > layout.tiles - first_tile) {
    return absl::OutOfRangeError(
        absl::StrCat("tiles [", first_tile, ", +", tile_count, ") of ", layout.tiles));
  }
  const uint32_t bits = layout.code_bits;
  const uint32_t escape_code = (1u << bits) - 1;
  const uint32_t side_bits = SideBits(layout.layout);
  const uint32_t limit = ExponentLimit(layout.layout);
  for (uint64_t tile = first_tile; tile < first_tile + tile_count; ++tile) {
    const uint64_t index = tile - first_tile;
    const uint64_t begin = LoadU32(tables.escape_starts + index);
    const uint64_t end = LoadU32(tables.escape_starts + index + 1);
    if (end < begin || end - begin > kTileWords || begin < tables.escapes_base ||
        end - tables.escapes_base > tables.escapes_count) {
      return Corrupt(absl::StrCat("tile ", tile, "'s escapes [", begin, ", ", end, ")"));
    }
    const uint8_t* data = tiles + index * layout.tile_bytes;
    const uint8_t* rest = data + kTileThreads * bits;
    const uint8_t* side = rest + kTileWords;
    uint64_t next_escape = begin;
    uint64_t sum = 0;
    bool bad_escape = false;
    const uint32_t code_mask = (1u << bits) - 1;
    const uint32_t side_mask = (1u << side_bits) - 1;
    for (uint32_t group = 0; group < kTileThreads; ++group) {
      const uint64_t first_word = tile * kTileWords + group * kGroupWords;
      const uint64_t codes = PackedGroup(data + group * bits, bits);
      const uint64_t sides = side_bits == 0 ? 0 : PackedGroup(side + group * side_bits, side_bits);
      uint16_t words[kGroupWords];
      for (uint32_t k = 0; k < kGroupWords; ++k) {
        const uint32_t code = static_cast<uint32_t>(codes >> (k * bits)) & code_mask;
        uint32_t exponent = layout.codebook[code < escape_code ? code : 0];
        if (code == escape_code) {
          if (next_escape < end) {
            exponent = tables.escapes[next_escape++ - tables.escapes_base];
            bad_escape |= exponent >= limit;
          } else {
            bad_escape = true;
          }
        }
        const uint32_t side_field = static_cast<uint32_t>(sides >> (k * side_bits)) & side_mask;
        words[k] = JoinWord(layout.layout, exponent, rest[group * kGroupWords + k], side_field);
      }
      if (first_word + kGroupWords <= layout.words) {
        std::memcpy(dst + 2 * first_word, words, sizeof(words));  // little-endian hosts only
      } else {
        for (uint32_t k = 0; k < kGroupWords; ++k) {
          if (first_word + k < layout.words) {
            std::memcpy(dst + 2 * (first_word + k), &words[k], 2);
          } else {
            words[k] = 0;  // padding: not written, counted as zero
          }
        }
      }
      sum +=
          LaneTerm(Lane(words, 0), first_word / 4) + LaneTerm(Lane(words, 1), first_word / 4 + 1);
    }
    if (bad_escape || next_escape != end) {
      return Corrupt(absl::StrCat("tile ", tile, "'s codes disagree with its escapes"));
    }
    if (FoldChecksum(sum) != LoadU32(tables.checksums + index)) {
      return Corrupt(absl::StrCat("tile ", tile, "'s checksum does not match its bytes"));
    }
  }
  if (first_tile + tile_count == layout.tiles && layout.tail_size == 1) {
    dst[layout.raw_bytes - 1] = static_cast<uint8_t>(layout.tail_byte);
  }
  return absl::OkStatus();
}

}  // namespace tierd::codec
