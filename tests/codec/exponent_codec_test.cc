// The exponent-codebook codec on the CPU: bit-exact round trips for every word there is, the
// ratios of initialised weights, what stays raw, and corrupted objects refused with DATA_LOSS.
#include "codec/exponent_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "testing/sample_weights.h"

namespace tierd::codec {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> NormalWeights(WordLayout layout, uint64_t words, uint64_t seed = 1) {
  std::vector<uint16_t> values(words);
  FillNormalWeights(layout, 0.02, seed, values.data(), words);
  std::vector<uint8_t> bytes(2 * words);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Options that compress any object, and up to `max_ratio` of its size.
EncodingOptions AnySize(double max_ratio = EncodingOptions().max_ratio) {
  EncodingOptions options;
  options.min_bytes = 0;
  options.max_ratio = max_ratio;
  return options;
}

std::vector<uint8_t> Compress(const std::vector<uint8_t>& raw,
                              const EncodingOptions& options = {}) {
  const EncodingPlan plan = PlanEncoding(raw.data(), raw.size(), options);
  EXPECT_TRUE(plan.compress) << plan.reason;
  std::vector<uint8_t> encoded(plan.encoded_bytes);
  EXPECT_TRUE(Encode(raw.data(), raw.size(), plan, encoded.data()).ok());
  return encoded;
}

std::vector<uint8_t> Decompress(const std::vector<uint8_t>& encoded) {
  absl::StatusOr<CompressedLayout> layout = ParseCompressed(encoded.data(), encoded.size());
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (!layout.ok()) return {};
  std::vector<uint8_t> raw(layout->raw_bytes, 0xa5);
  const absl::Status status = Decode(*layout, encoded.data(), raw.data());
  EXPECT_TRUE(status.ok()) << status;
  return raw;
}

TEST(ExponentCodecTest, NormalBf16WeightsCompressToUnderThreeQuartersAndBack) {
  for (const uint64_t words : {32768ull, 32768ull + 1, 2048ull * 100 + 7, 1ull << 20}) {
    const std::vector<uint8_t> raw = NormalWeights(WordLayout::kBf16, words);
    const EncodingPlan plan = PlanEncoding(raw.data(), raw.size());
    ASSERT_TRUE(plan.compress) << plan.reason;
    EXPECT_EQ(plan.layout, WordLayout::kBf16);
    EXPECT_LT(plan.ratio(), 0.75) << words << " words";
    EXPECT_EQ(Decompress(Compress(raw)), raw) << words << " words";
  }
}

TEST(ExponentCodecTest, NormalFp16WeightsCompressLess) {
  // fp16's exponent has 5 bits, so less to save; whichever word layout codes it smaller is taken.
  const std::vector<uint8_t> raw = NormalWeights(WordLayout::kFp16, 300000);
  const EncodingPlan plan = PlanEncoding(raw.data(), raw.size());
  ASSERT_TRUE(plan.compress) << plan.reason;
  EXPECT_LT(plan.ratio(), 0.9);
  EXPECT_EQ(Decompress(Compress(raw)), raw);
}

TEST(ExponentCodecTest, EveryWordRoundTripsAtEveryCodeWidth) {
  // Each of the 65536 words (NaNs, infinities, subnormals, negative zero) among normal weights, so
  // the codebook is a real one and most of them escape.
  std::vector<uint8_t> raw = NormalWeights(WordLayout::kBf16, 4 * 65536 + 3);
  for (uint32_t word = 0; word < 65536; ++word) {
    raw[8 * word] = static_cast<uint8_t>(word);
    raw[8 * word + 1] = static_cast<uint8_t>(word >> 8);
  }
  raw.push_back(0x7f);  // an odd size: the tail byte
  for (const WordLayout layout : kWordLayouts) {
    EncodingPlan plan = PlanEncoding(raw.data(), raw.size(), AnySize(2.0));
    for (uint32_t bits = kMinCodeBits; bits <= kMaxCodeBits; ++bits) {
      // A plan for another layout and width: the codebook's first codes stay valid exponents.
      plan.layout = layout;
      plan.code_bits = bits;
      for (uint8_t& symbol : plan.codebook) symbol %= ExponentLimit(layout);
      uint64_t escapes = 0;
      const uint32_t named = std::min((1u << bits) - 1, ExponentLimit(layout));
      for (uint64_t i = 0; i + 1 < raw.size(); i += 2) {
        const uint16_t word = static_cast<uint16_t>(raw[i] | (raw[i + 1] << 8));
        const uint8_t* begin = plan.codebook;
        const uint8_t* end = begin + named;
        escapes += std::find(begin, end, static_cast<uint8_t>(Exponent(layout, word))) == end;
      }
      plan.escapes = escapes;
      CompressedLayout sizes{};
      sizes.layout = layout;
      sizes.code_bits = bits;
      sizes.tail_size = 1;
      sizes.raw_bytes = raw.size();
      sizes.escapes = escapes;
      ComputeOffsets(sizes);
      plan.encoded_bytes = sizes.encoded_bytes;
      std::vector<uint8_t> encoded(plan.encoded_bytes);
      ASSERT_TRUE(Encode(raw.data(), raw.size(), plan, encoded.data()).ok());
      EXPECT_EQ(Decompress(encoded), raw)
          << "layout " << static_cast<int>(layout) << ", " << bits << " bits";
    }
  }
}

TEST(ExponentCodecTest, EveryWordSplitsAndJoinsBackInEveryLayout) {
  for (const WordLayout layout : kWordLayouts) {
    for (uint32_t word = 0; word < 65536; ++word) {
      const auto w = static_cast<uint16_t>(word);
      ASSERT_LT(Exponent(layout, w), ExponentLimit(layout));
      ASSERT_LT(Rest(layout, w), 256u);
      ASSERT_LT(Side(layout, w), 1u << SideBits(layout));
      ASSERT_EQ(JoinWord(layout, Exponent(layout, w), Rest(layout, w), Side(layout, w)), w)
          << "layout " << static_cast<int>(layout) << ", word " << word;
    }
  }
  // An FP8 pair's symbol is the two values' e4m3 exponents (for e5m2: their top 4 bits).
  EXPECT_EQ(Exponent(WordLayout::kFp8Pair, 0x3c41), 0x78u);  // hi 0x3c: exponent 7; lo 0x41: 8
  EXPECT_EQ(Rest(WordLayout::kFp8Pair, 0x3c41), 0x41u);      // sign, mantissa: hi 0 100, lo 0 001
}

// The codes of every finite FP8 value survive the test support's conversions, so the weights
// below are what a quantiser writes.
TEST(ExponentCodecTest, Fp8ConversionsRoundTripEveryFiniteValue) {
  for (const Fp8Format format : {Fp8Format::kE4m3, Fp8Format::kE5m2}) {
    for (uint32_t code = 0; code < 256; ++code) {
      const float value = Fp8ToFloat(format, static_cast<uint8_t>(code));
      if (!std::isfinite(value)) continue;
      EXPECT_EQ(FloatToFp8(format, value), code) << value;
    }
    EXPECT_EQ(FloatToFp8(format, 1e9f), FloatToFp8(format, Fp8Max(format)));  // saturated
  }
  EXPECT_EQ(Fp8Max(Fp8Format::kE4m3), 448.0f);
  EXPECT_EQ(Fp8Max(Fp8Format::kE5m2), 57344.0f);
  EXPECT_EQ(FloatToFp8(Fp8Format::kE4m3, 1.0625f), 0x38);  // halfway: to the even mantissa, 1
  EXPECT_EQ(FloatToFp8(Fp8Format::kE4m3, 1.1875f), 0x3a);  // halfway: to 1.25
}

// FP8 weights quantised with 128 × 128 block scales from N(0, 0.02²): each value's exponent has
// ~2.55 bits of entropy (measured below), and its sign and mantissa 4 (e4m3) or 3 (e5m2) bits that
// no code shrinks. A pair's two e4m3 exponents coded together in 5 bits take e4m3 to ~0.87 of its
// bytes (the bound for any code of the exponents: (4 + 2.55) / 8 = 0.818); e5m2's top exponent
// bits, in 3 bits, to ~0.76 (its bound: (3 + 2.55) / 8 = 0.694).
TEST(ExponentCodecTest, BlockScaledFp8WeightsCompressAsPairsAndBack) {
  constexpr uint64_t kRows = 512, kCols = 1024, kBlock = 128;
  for (const Fp8Format format : {Fp8Format::kE4m3, Fp8Format::kE5m2}) {
    std::vector<uint8_t> raw(kRows * kCols);
    std::vector<float> scales((kRows / kBlock) * (kCols / kBlock));
    FillBlockScaledFp8Weights(format, 0.02, 3, kRows, kCols, kBlock, raw.data(), scales.data());
    const EncodingPlan plan = PlanEncoding(raw.data(), raw.size());
    ASSERT_TRUE(plan.compress) << plan.reason;
    EXPECT_EQ(plan.layout, WordLayout::kFp8Pair);
    const bool e4m3 = format == Fp8Format::kE4m3;
    EXPECT_EQ(plan.code_bits, e4m3 ? 5u : 3u);
    EXPECT_GT(plan.ratio(), e4m3 ? 0.82 : 0.69);
    EXPECT_LT(plan.ratio(), e4m3 ? 0.89 : 0.78);
    // The bound for any lossless code of the exponents, from these values' own statistics: the
    // sign and mantissa bits as they are, the exponent at its entropy.
    std::vector<uint64_t> counts(32);
    const uint32_t mantissa_bits = e4m3 ? 3 : 2;
    for (const uint8_t value : raw) ++counts[(value & 0x7f) >> mantissa_bits];
    double entropy = 0;
    for (const uint64_t count : counts) {
      if (count == 0) continue;
      const double p = static_cast<double>(count) / raw.size();
      entropy -= p * std::log2(p);
    }
    EXPECT_NEAR(entropy, 2.55, 0.05);
    const double bound = (1 + mantissa_bits + entropy) / 8;
    EXPECT_NEAR(bound, e4m3 ? 0.818 : 0.694, 0.005);
    EXPECT_GT(plan.ratio(), bound);
    EXPECT_EQ(Decompress(Compress(raw)), raw);
    // The scales are float32, served as they are: too small to pay for tables.
    const auto* scale_bytes = reinterpret_cast<const uint8_t*>(scales.data());
    EXPECT_FALSE(PlanEncoding(scale_bytes, scales.size() * sizeof(float)).compress);
  }
}

TEST(ExponentCodecTest, DecodingTileRangesGivesTheWholeObject) {
  std::vector<uint8_t> raw = NormalWeights(WordLayout::kBf16, 2048 * 9 + 5);
  raw.push_back(3);
  const std::vector<uint8_t> encoded = Compress(raw, AnySize());
  absl::StatusOr<CompressedLayout> layout = ParseCompressed(encoded.data(), encoded.size());
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tiles, 10u);
  std::vector<uint8_t> out(raw.size(), 0);
  for (const auto& [first, count] : {std::pair{0, 3}, {3, 1}, {4, 0}, {4, 6}}) {
    ASSERT_TRUE(DecodeTiles(*layout, TablesInPrefix(*layout, encoded.data(), first),
                            TileData(*layout, encoded.data(), first), out.data(), first, count)
                    .ok());
  }
  EXPECT_EQ(out, raw);
  EXPECT_EQ(DecodeTiles(*layout, TablesInPrefix(*layout, encoded.data(), 9), encoded.data(),
                        out.data(), 9, 2)
                .code(),
            absl::StatusCode::kOutOfRange);
}

TEST(ExponentCodecTest, WhatDoesNotPayStaysRaw) {
  std::mt19937_64 engine(7);
  std::vector<uint8_t> random(1 << 20);
  for (uint8_t& byte : random) byte = static_cast<uint8_t>(engine());
  EncodingPlan plan = PlanEncoding(random.data(), random.size());
  EXPECT_FALSE(plan.compress);
  EXPECT_THAT(plan.reason, HasSubstr("compresses only to"));
  EXPECT_EQ(plan.encoded_bytes, random.size());

  // int8 weights: both bytes of a "word" are values, so no exponent field is skewed enough.
  std::normal_distribution<float> normal(0, 40);
  std::vector<uint8_t> int8(1 << 20);
  for (uint8_t& byte : int8) {
    // Saturated, as a quantizer does (a float outside int8's range has no conversion).
    byte = static_cast<uint8_t>(std::clamp(std::lround(normal(engine)), -128L, 127L));
  }
  plan = PlanEncoding(int8.data(), int8.size());
  EXPECT_FALSE(plan.compress) << plan.ratio();

  const std::vector<uint8_t> small = NormalWeights(WordLayout::kBf16, 1000);
  plan = PlanEncoding(small.data(), small.size());
  EXPECT_FALSE(plan.compress);
  EXPECT_THAT(plan.reason, HasSubstr("smaller than"));
  EXPECT_EQ(Encode(small.data(), small.size(), plan, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ExponentCodecTest, EncodingBytesThatChangedSincePlanningIsDataLoss) {
  std::vector<uint8_t> raw = NormalWeights(WordLayout::kBf16, 100000);
  const EncodingPlan plan = PlanEncoding(raw.data(), raw.size());
  ASSERT_TRUE(plan.compress);
  for (uint64_t i = 1; i < raw.size(); i += 2) raw[i] = 0x7f;  // every exponent escapes now
  std::vector<uint8_t> encoded(plan.encoded_bytes);
  EXPECT_EQ(Encode(raw.data(), raw.size(), plan, encoded.data()).code(),
            absl::StatusCode::kDataLoss);
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    raw_ = NormalWeights(WordLayout::kBf16, 2048 * 20);
    encoded_ = Compress(raw_);
    absl::StatusOr<CompressedLayout> layout = ParseCompressed(encoded_.data(), encoded_.size());
    ASSERT_TRUE(layout.ok());
    layout_ = *layout;
    ASSERT_GT(layout_.escapes, 10u);
  }

  // Decodes `encoded` with the header checks only, as a GPU decode does.
  absl::Status DecodeTrustingTables(const std::vector<uint8_t>& encoded) {
    absl::StatusOr<CompressedLayout> layout = ParseCompressedHeader(encoded.data(), encoded.size());
    if (!layout.ok()) return layout.status();
    std::vector<uint8_t> out(layout->raw_bytes);
    return Decode(*layout, encoded.data(), out.data());
  }

  std::vector<uint8_t> raw_;
  std::vector<uint8_t> encoded_;
  CompressedLayout layout_{};
};

TEST_F(CorruptionTest, AFlippedBitAnywhereInTheDataIsCaughtByItsTile) {
  std::mt19937_64 engine(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> encoded = encoded_;
    const uint64_t at =
        layout_.escapes_offset + engine() % (encoded.size() - layout_.escapes_offset);
    encoded[at] ^= static_cast<uint8_t>(1u << (engine() % 8));
    if (at >= layout_.escapes_offset + layout_.escapes && at < layout_.data_offset) continue;
    const absl::Status status = DecodeTrustingTables(encoded);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << "byte " << at;
    EXPECT_THAT(status.message(), HasSubstr("tile")) << "byte " << at;
  }
}

TEST_F(CorruptionTest, BadTablesAreRefusedBeforeDecoding) {
  std::vector<uint8_t> encoded = encoded_;
  uint32_t start;
  std::memcpy(&start, &encoded[layout_.escape_starts_offset + 4 * 5], 4);
  start += 4096;
  std::memcpy(&encoded[layout_.escape_starts_offset + 4 * 5], &start, 4);
  EXPECT_EQ(ParseCompressed(encoded.data(), encoded.size()).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeTrustingTables(encoded).code(), absl::StatusCode::kDataLoss);

  for (const auto& [offset, what] : {std::pair{0, "bad magic"},
                                     {4, "version"},
                                     {5, "layout"},
                                     {6, "code width"},
                                     {7, "tail"},
                                     {16, "encoded size"},
                                     {24, "escapes"}}) {
    encoded = encoded_;
    encoded[offset] ^= 0x40;
    const absl::Status status = ParseCompressedHeader(encoded.data(), encoded.size()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << what;
  }
  encoded = encoded_;
  encoded[offsetof(Header, codebook)] = 0;  // still a valid exponent: wrong bytes, caught by tiles
  EXPECT_EQ(DecodeTrustingTables(encoded).code(), absl::StatusCode::kDataLoss);
  encoded.pop_back();
  EXPECT_EQ(ParseCompressed(encoded.data(), encoded.size()).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseCompressedHeader(encoded.data(), 100).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace tierd::codec
