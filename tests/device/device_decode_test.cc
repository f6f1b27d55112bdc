// Device::DecodeAsync on each backend (host in CI; CUDA on a GPU): compressed objects made by the
// CPU codec decode to their bytes in device memory, in tile ranges as a pipelined fetch runs them —
// from the object's whole prefix, or each range with its own tables copied apart, as the GPU tier
// decodes an object in parts — and a corrupted one sets the verdict instead of passing for good
// bytes.
#include <cstring>
#include <vector>

#include "codec/exponent_codec.h"
#include "testing/sample_weights.h"
#include "device/device.h"
#include "device/pinned_host_buffer.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

class DeviceDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = CreateDevice(testing::DeviceUnderTest());
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    auto stream = device_->CreateStream(StreamPriority::kNormal);
    ASSERT_THAT(stream, IsOk());
    stream_ = *std::move(stream);
    auto verdict = PinnedHostBuffer::Create(*device_, 4096);
    ASSERT_THAT(verdict, IsOk());
    verdict_buffer_ = *std::move(verdict);
    verdict_ = static_cast<uint32_t*>(verdict_buffer_->data());
  }

  // `words` normal bf16 weights, and `odd_tail` more byte when asked.
  static std::vector<uint8_t> Weights(uint64_t words, bool odd_tail) {
    std::vector<uint16_t> values(words);
    codec::FillNormalWeights(codec::WordLayout::kBf16, 0.02, 11, values.data(), words);
    std::vector<uint8_t> bytes(2 * words + (odd_tail ? 1 : 0), 0x5b);
    std::memcpy(bytes.data(), values.data(), 2 * words);
    return bytes;
  }

  static std::vector<uint8_t> Compress(const std::vector<uint8_t>& raw) {
    const codec::EncodingPlan plan = codec::PlanEncoding(raw.data(), raw.size());
    EXPECT_TRUE(plan.compress) << plan.reason;
    std::vector<uint8_t> encoded(plan.encoded_bytes);
    EXPECT_THAT(codec::Encode(raw.data(), raw.size(), plan, encoded.data()), IsOk());
    return encoded;
  }

  enum class Tables {
    kWholePrefix,    // the object's prefix copied once, every range decoded from it
    kEachRangesOwn,  // each range's tables (codec::TileTables) copied apart before it
  };

  // Decodes `encoded` on the device as the GPU tier does: its tables copied to one slab, then its
  // tiles in `pieces` ranges, each copied to the front of a scratch slab and decoded from there.
  // Returns the decoded bytes copied back; the verdict is left in *verdict_.
  std::vector<uint8_t> DecodeOnDevice(const std::vector<uint8_t>& encoded, uint64_t pieces,
                                      Tables tables_from = Tables::kWholePrefix) {
    absl::StatusOr<codec::CompressedLayout> layout =
        codec::ParseCompressedHeader(encoded.data(), encoded.size());
    EXPECT_THAT(layout, IsOk());
    if (!layout.ok()) return {};
    const uint64_t per_piece = (layout->tiles + pieces - 1) / pieces;
    auto host = PinnedHostBuffer::Create(*device_, encoded.size() + layout->raw_bytes);
    auto prefix = device_->AllocateSlab(layout->data_offset);
    auto scratch = device_->AllocateSlab(per_piece * layout->tile_bytes);
    auto out = device_->AllocateSlab(layout->raw_bytes);
    EXPECT_THAT(host, IsOk());
    EXPECT_THAT(prefix, IsOk());
    EXPECT_THAT(scratch, IsOk());
    EXPECT_THAT(out, IsOk());
    if (!host.ok() || !prefix.ok() || !scratch.ok() || !out.ok()) return {};
    auto* staged = static_cast<uint8_t*>((*host)->data());
    std::memcpy(staged, encoded.data(), encoded.size());
    *verdict_ = 0;
    auto* device_prefix = static_cast<uint8_t*>((*prefix)->data());
    if (tables_from == Tables::kWholePrefix) {
      EXPECT_THAT(device_->CopyAsync(*stream_, device_prefix, staged, layout->data_offset), IsOk());
    }
    for (uint64_t first = 0; first < layout->tiles; first += per_piece) {
      const uint64_t count = std::min(per_piece, layout->tiles - first);
      EXPECT_THAT(
          device_->CopyAsync(*stream_, (*scratch)->data(), codec::TileData(*layout, staged, first),
                             count * layout->tile_bytes),
          IsOk());
      const codec::TileTables tables = tables_from == Tables::kWholePrefix
                                           ? codec::TablesInPrefix(*layout, device_prefix, first)
                                           : CopyRangesTables(*layout, staged, first, count,
                                                              device_prefix);
      EXPECT_THAT(device_->DecodeAsync(*stream_, *layout, tables, (*scratch)->data(),
                                       (*out)->data(), first, count, verdict_),
                  IsOk());
    }
    uint8_t* result = staged + encoded.size();
    EXPECT_THAT(device_->CopyAsync(*stream_, result, (*out)->data(), layout->raw_bytes), IsOk());
    EXPECT_THAT(device_->SynchronizeStream(*stream_), IsOk());
    return std::vector<uint8_t>(result, result + layout->raw_bytes);
  }

  // Enqueues the copy of tiles [first, first + count)'s tables from the object at `staged` to
  // `dst` (room for the whole prefix: a range's tables take less), laid out as the GPU tier lays
  // them out; returns them.
  codec::TileTables CopyRangesTables(const codec::CompressedLayout& layout, const uint8_t* staged,
                                     uint64_t first, uint64_t count, uint8_t* dst) {
    const codec::EscapeRange escapes = codec::EscapesOfTiles(layout, staged, first, count);
    uint8_t* const starts = dst + codec::AlignUp16(4 * count);
    uint8_t* const part_escapes = starts + codec::AlignUp16(4 * (count + 1));
    EXPECT_THAT(device_->CopyAsync(*stream_, dst, staged + layout.checksums_offset + 4 * first,
                                   4 * count),
                IsOk());
    EXPECT_THAT(device_->CopyAsync(*stream_, starts,
                                   staged + layout.escape_starts_offset + 4 * first,
                                   4 * (count + 1)),
                IsOk());
    if (escapes.count > 0) {
      EXPECT_THAT(device_->CopyAsync(*stream_, part_escapes,
                                     staged + layout.escapes_offset + escapes.base, escapes.count),
                  IsOk());
    }
    return codec::TileTables{reinterpret_cast<const uint32_t*>(dst),
                             reinterpret_cast<const uint32_t*>(starts), part_escapes,
                             escapes.base, escapes.count};
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<PinnedHostBuffer> verdict_buffer_;
  uint32_t* verdict_ = nullptr;
};

TEST_F(DeviceDecodeTest, DecodesToTheObjectsBytesWholeAndInTileRanges) {
  for (const bool odd_tail : {false, true}) {
    // Not a whole number of tiles or of 8-word groups: the last group is padded.
    const std::vector<uint8_t> raw = Weights(2048 * 300 + 5, odd_tail);
    const std::vector<uint8_t> encoded = Compress(raw);
    for (const uint64_t pieces : {1, 7}) {
      EXPECT_EQ(DecodeOnDevice(encoded, pieces), raw) << pieces << " pieces, tail " << odd_tail;
      EXPECT_EQ(*verdict_, 0u);
      EXPECT_EQ(DecodeOnDevice(encoded, pieces, Tables::kEachRangesOwn), raw)
          << pieces << " pieces with their own tables, tail " << odd_tail;
      EXPECT_EQ(*verdict_, 0u);
    }
  }
}

TEST_F(DeviceDecodeTest, DecodesBlockScaledFp8Weights) {
  for (const codec::Fp8Format format : {codec::Fp8Format::kE4m3, codec::Fp8Format::kE5m2}) {
    std::vector<uint8_t> raw(384 * 1024);
    std::vector<float> scales(3 * 8);
    codec::FillBlockScaledFp8Weights(format, 0.02, 5, 384, 1024, 128, raw.data(), scales.data());
    raw.push_back(0x7f);  // an odd size: a NaN in the tail byte
    const std::vector<uint8_t> encoded = Compress(raw);
    absl::StatusOr<codec::CompressedLayout> layout =
        codec::ParseCompressed(encoded.data(), encoded.size());
    ASSERT_THAT(layout, IsOk());
    EXPECT_EQ(layout->layout, codec::WordLayout::kFp8Pair);
    EXPECT_EQ(DecodeOnDevice(encoded, 5), raw);
    EXPECT_EQ(*verdict_, 0u);
    EXPECT_EQ(DecodeOnDevice(encoded, 5, Tables::kEachRangesOwn), raw);
    EXPECT_EQ(*verdict_, 0u);
  }
}

TEST_F(DeviceDecodeTest, DecodesEveryWordAtEveryCodeWidth) {
  std::vector<uint8_t> raw = Weights(4 * 65536, false);
  for (uint32_t word = 0; word < 65536; ++word) std::memcpy(&raw[8 * word], &word, 2);
  codec::EncodingOptions options;
  options.max_ratio = 2;
  const codec::EncodingPlan best = codec::PlanEncoding(raw.data(), raw.size(), options);
  ASSERT_TRUE(best.compress);
  for (const codec::WordLayout layout : codec::kWordLayouts) {
    for (uint32_t bits = codec::kMinCodeBits; bits <= codec::kMaxCodeBits; ++bits) {
      codec::EncodingPlan plan = best;
      plan.layout = layout;
      plan.code_bits = bits;
      // The most frequent exponents of this layout, by counting them.
      std::vector<uint64_t> counts(codec::ExponentLimit(layout));
      for (uint64_t i = 0; i < raw.size(); i += 2) {
        ++counts[codec::Exponent(layout, static_cast<uint16_t>(raw[i] | (raw[i + 1] << 8)))];
      }
      const uint32_t named = std::min((1u << bits) - 1, codec::ExponentLimit(layout));
      plan.escapes = raw.size() / 2;
      for (uint32_t k = 0; k < named; ++k) {
        const auto top = std::max_element(counts.begin(), counts.end());
        plan.codebook[k] = static_cast<uint8_t>(top - counts.begin());
        plan.escapes -= *top;
        *top = 0;
      }
      codec::CompressedLayout sizes{};
      sizes.layout = layout;
      sizes.code_bits = bits;
      sizes.raw_bytes = raw.size();
      sizes.escapes = plan.escapes;
      codec::ComputeOffsets(sizes);
      plan.encoded_bytes = sizes.encoded_bytes;
      std::vector<uint8_t> encoded(plan.encoded_bytes);
      ASSERT_THAT(codec::Encode(raw.data(), raw.size(), plan, encoded.data()), IsOk());
      EXPECT_EQ(DecodeOnDevice(encoded, 3), raw)
          << "layout " << static_cast<int>(layout) << ", " << bits << " bits";
      EXPECT_EQ(*verdict_, 0u);
    }
  }
}

TEST_F(DeviceDecodeTest, ACorruptedObjectSetsTheVerdict) {
  const std::vector<uint8_t> raw = Weights(2048 * 64, false);
  const std::vector<uint8_t> good = Compress(raw);
  absl::StatusOr<codec::CompressedLayout> layout = codec::ParseCompressed(good.data(), good.size());
  ASSERT_THAT(layout, IsOk());
  const uint64_t at[] = {
      layout->data_offset + 5 * layout->tile_bytes + 700,  // a tile's codes or rest
      layout->escapes_offset + layout->escapes / 2,        // an escaped exponent
      layout->escape_starts_offset + 4 * 9,                // where a tile's escapes start
      layout->checksums_offset + 4 * 63,                   // the last tile's checksum
  };
  for (const Tables tables_from : {Tables::kWholePrefix, Tables::kEachRangesOwn}) {
    for (const uint64_t offset : at) {
      std::vector<uint8_t> bad = good;
      bad[offset] ^= 0x10;
      DecodeOnDevice(bad, 2, tables_from);
      EXPECT_NE(*verdict_, 0u) << "byte " << offset;
    }
    // Escape starts past the escape stream, or going backwards across the ranges' boundary:
    // refused on the device, nothing read past the object or the range's tables.
    for (const auto& [tile, start] : {std::pair<uint64_t, uint32_t>{10, 0xfffffff0u}, {32, 0}}) {
      std::vector<uint8_t> bad = good;
      std::memcpy(&bad[layout->escape_starts_offset + 4 * tile], &start, 4);
      std::memcpy(&bad[layout->escape_starts_offset + 4 * (tile + 1)], &start, 4);
      DecodeOnDevice(bad, 2, tables_from);
      EXPECT_NE(*verdict_, 0u) << "tile " << tile << "'s escapes starting at " << start;
    }
  }
}

TEST_F(DeviceDecodeTest, BadArgumentsAreInvalidArgument) {
  const std::vector<uint8_t> encoded = Compress(Weights(2048 * 40, false));
  absl::StatusOr<codec::CompressedLayout> layout =
      codec::ParseCompressed(encoded.data(), encoded.size());
  ASSERT_THAT(layout, IsOk());
  auto slab = device_->AllocateSlab(layout->raw_bytes + 64);
  ASSERT_THAT(slab, IsOk());
  auto* base = static_cast<uint8_t*>((*slab)->data());
  const codec::TileTables tables = codec::TablesInPrefix(*layout, base, 0);
  EXPECT_THAT(device_->DecodeAsync(*stream_, *layout, tables, base, base, 39, 2, verdict_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  codec::TileTables misaligned = tables;
  misaligned.checksums = reinterpret_cast<const uint32_t*>(base + 2);
  EXPECT_THAT(device_->DecodeAsync(*stream_, *layout, misaligned, base, base, 0, 1, verdict_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  misaligned = tables;
  misaligned.escape_starts = reinterpret_cast<const uint32_t*>(base + 1);
  EXPECT_THAT(device_->DecodeAsync(*stream_, *layout, misaligned, base, base, 0, 1, verdict_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(device_->DecodeAsync(*stream_, *layout, tables, base + 4, base, 0, 1, verdict_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  codec::TileTables missing = tables;
  missing.escapes = nullptr;
  EXPECT_THAT(device_->DecodeAsync(*stream_, *layout, missing, base, base, 0, 1, verdict_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(device_->DecodeAsync(*stream_, *layout, tables, base, base, 0, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tierd
