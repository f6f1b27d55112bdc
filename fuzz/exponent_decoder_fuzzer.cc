// Fuzzes the exponent-codebook decoder (codec/exponent_codec.h) with malformed compressed objects:
// whatever the bytes, parsing and decoding — whole, or in parts each with its own tables, as the
// GPU tier decodes — must stay inside the input, the tables and the output (ASan checks) and
// either refuse with DATA_LOSS or produce exactly the object's bytes. Half the inputs are a
// real compressed object (of weights the first bytes seed) with a few bytes overwritten, so that
// the fuzzer reaches the tiles past the header's checks, in every word layout: bf16 or fp16 weights,
// or FP8 (e4m3, e5m2) weights quantised with block scales.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codec/exponent_codec.h"
#include "testing/sample_weights.h"

namespace {

using tierd::codec::CompressedLayout;

// Decodes tiles [first, first + count) of `data` with those tiles' tables alone, copied apart as
// the GPU tier copies a part's (each into a buffer of exactly its size, so that ASan sees a read
// past them).
absl::Status DecodePart(const CompressedLayout& layout, const std::vector<uint8_t>& data,
                        uint64_t first, uint64_t count, uint8_t* out) {
  const tierd::codec::EscapeRange escapes =
      tierd::codec::EscapesOfTiles(layout, data.data(), first, count);
  std::vector<uint32_t> checksums(count);
  std::vector<uint32_t> starts(count + 1);
  std::vector<uint8_t> part_escapes(escapes.count);
  if (count > 0) {
    std::memcpy(checksums.data(), data.data() + layout.checksums_offset + 4 * first, 4 * count);
  }
  std::memcpy(starts.data(), data.data() + layout.escape_starts_offset + 4 * first,
              4 * (count + 1));
  if (escapes.count > 0) {
    std::memcpy(part_escapes.data(), data.data() + layout.escapes_offset + escapes.base,
                escapes.count);
  }
  const tierd::codec::TileTables tables{checksums.data(), starts.data(), part_escapes.data(),
                                        escapes.base, escapes.count};
  return tierd::codec::DecodeTiles(layout, tables,
                                   tierd::codec::TileData(layout, data.data(), first), out, first,
                                   count);
}

// Decodes `data` (parsed from its header only, as a GPU decode trusts its tables no further) into
// a buffer of exactly the object's size — whole, and in two parts split at `split` (a fraction of
// 256 of its tiles) — and aborts on a decode that claims success for wrong bytes, or on the two
// ways disagreeing about success.
void DecodeAll(const std::vector<uint8_t>& data, const std::vector<uint8_t>* original,
               uint8_t split) {
  absl::StatusOr<CompressedLayout> layout =
      tierd::codec::ParseCompressedHeader(data.data(), data.size());
  if (!layout.ok() || layout->encoded_bytes != data.size() || layout->raw_bytes > (64u << 20)) {
    return;
  }
  std::vector<uint8_t> out(layout->raw_bytes);
  const absl::Status decoded = tierd::codec::Decode(*layout, data.data(), out.data());
  if (decoded.ok() && original != nullptr && out != *original) {
    std::fprintf(stderr, "a corrupted object decoded without an error to other bytes\n");
    std::abort();
  }
  const uint64_t first_part = layout->tiles * split / 256;
  std::vector<uint8_t> in_parts(layout->raw_bytes);
  absl::Status parts = DecodePart(*layout, data, 0, first_part, in_parts.data());
  if (parts.ok()) {
    parts = DecodePart(*layout, data, first_part, layout->tiles - first_part, in_parts.data());
  }
  if (parts.ok() != decoded.ok() || (parts.ok() && in_parts != out)) {
    std::fprintf(stderr, "decoding in parts at tile %llu: %s, whole: %s\n",
                 static_cast<unsigned long long>(first_part), parts.ToString().c_str(),
                 decoded.ToString().c_str());
    std::abort();
  }
  (void)tierd::codec::ParseCompressed(data.data(), data.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  if ((data[0] & 1) == 0) {
    DecodeAll(std::vector<uint8_t>(data + 1, data + size), nullptr, data[1]);
    return 0;
  }
  // A real object of 1..16 tiles of normal weights, then (offset, xor) pairs applied to it. A
  // corruption may leave the bytes decoding right (a flipped bit in padding, a checksum collision
  // is 2^-32): only a successful decode to other bytes is a failure. The seed's low bits pick the
  // weights' format (the planner picks the layout that codes them smallest).
  const uint64_t words = (uint64_t{data[1]} % 16 + 1) * tierd::codec::kTileWords - data[2] % 7;
  std::vector<uint8_t> raw(2 * words);
  switch (data[3] % 4) {
    case 0:
    case 1: {
      std::vector<uint16_t> values(words);
      const auto layout =
          data[3] % 4 == 0 ? tierd::codec::WordLayout::kBf16 : tierd::codec::WordLayout::kFp16;
      tierd::codec::FillNormalWeights(layout, 0.02, data[3], values.data(), words);
      std::memcpy(raw.data(), values.data(), raw.size());
      break;
    }
    default: {
      // Rows of 256 values in blocks of 128, as FP8 checkpoints are scaled.
      const auto format =
          data[3] % 4 == 2 ? tierd::codec::Fp8Format::kE4m3 : tierd::codec::Fp8Format::kE5m2;
      const uint64_t rows = (raw.size() + 255) / 256;
      std::vector<uint8_t> values(rows * 256);
      std::vector<float> scales(((rows + 127) / 128) * 2);
      tierd::codec::FillBlockScaledFp8Weights(format, 0.02, data[3], rows, 256, 128,
                                              values.data(), scales.data());
      std::memcpy(raw.data(), values.data(), raw.size());
      break;
    }
  }
  tierd::codec::EncodingOptions options;
  options.min_bytes = 0;
  const tierd::codec::EncodingPlan plan =
      tierd::codec::PlanEncoding(raw.data(), raw.size(), options);
  if (!plan.compress) return 0;
  std::vector<uint8_t> encoded(plan.encoded_bytes);
  if (!tierd::codec::Encode(raw.data(), raw.size(), plan, encoded.data()).ok()) std::abort();
  for (size_t i = 4; i + 4 <= size; i += 4) {
    const uint32_t offset = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16);
    encoded[offset % encoded.size()] ^= data[i + 3];
  }
  DecodeAll(encoded, &raw, data[2]);
  return 0;
}
