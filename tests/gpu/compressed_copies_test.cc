// CompressedCopies on the host device: an object whose tables pass the bound a part may take is
// decoded in parts, each with only its own tables in the tables ring, to the object's bytes; under
// the default bound the same object is one part; escape starts that lie fail the decode
// (DATA_LOSS) and make it read nothing past the part's tables.
#include "gpu/detail/compressed_copies.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "codec/exponent_codec.h"
#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/sample_weights.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

// 8 MiB of e4m3 weights: about 0.11 escapes a word, so ~450 KB of escapes.
constexpr uint64_t kRows = 2048;
constexpr uint64_t kCols = 4096;
// The least bound (the tables ring's granule): parts of about 290 tiles, ~1.2 MiB of the object.
constexpr uint64_t kSmallPartTablesBytes = 64 << 10;

// A device that notes the tables and tiles of every decode.
class DecodeRecordingDevice : public DeviceWrapper {
 public:
  using DeviceWrapper::DeviceWrapper;

  struct Decode {
    uint64_t first_tile;
    uint64_t tile_count;
    uint64_t escapes_count;
  };

  absl::Status DecodeAsync(Stream& stream, const codec::CompressedLayout& layout,
                           const codec::TileTables& tables, const void* tiles, void* dst,
                           uint64_t first_tile, uint64_t tile_count, uint32_t* verdict) override {
    {
      absl::MutexLock lock(&mu_);
      decodes_.push_back({first_tile, tile_count, tables.escapes_count});
    }
    return DeviceWrapper::DecodeAsync(stream, layout, tables, tiles, dst, first_tile, tile_count,
                                      verdict);
  }
  std::vector<Decode> decodes() const {
    absl::MutexLock lock(&mu_);
    return decodes_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Decode> decodes_ ABSL_GUARDED_BY(mu_);
};

// Host memory in one pinned piece.
class OnePiece : public PinnedPieceBoundaries {
 public:
  explicit OnePiece(const uint8_t* end) : end_(end) {}
  uint64_t BytesToPieceEnd(const uint8_t* host) const override {
    return static_cast<uint64_t>(end_ - host);
  }

 private:
  const uint8_t* end_;
};

class CompressedCopiesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto host_device = HostDevice::Create();
    ASSERT_THAT(host_device, IsOk());
    host_device_ = *std::move(host_device);
    device_ = std::make_unique<DecodeRecordingDevice>(*host_device_);
    auto stream = device_->CreateStream(StreamPriority::kNormal);
    ASSERT_THAT(stream, IsOk());
    stream_ = *std::move(stream);

    raw_.resize(kRows * kCols);
    std::vector<float> scales((kRows / 128) * (kCols / 128));
    codec::FillBlockScaledFp8Weights(codec::Fp8Format::kE4m3, 0.02, 11, kRows, kCols, 128,
                                     raw_.data(), scales.data());
    const codec::EncodingPlan plan = codec::PlanEncoding(raw_.data(), raw_.size());
    ASSERT_TRUE(plan.compress) << plan.reason;
    ASSERT_EQ(plan.layout, codec::WordLayout::kFp8Pair);
    auto host = PinnedHostBuffer::Create(*device_, plan.encoded_bytes);
    ASSERT_THAT(host, IsOk());
    host_ = *std::move(host);
    encoded_ = static_cast<uint8_t*>(host_->data());
    ASSERT_THAT(codec::Encode(raw_.data(), raw_.size(), plan, encoded_), IsOk());
    auto layout = codec::ParseCompressed(encoded_, plan.encoded_bytes);
    ASSERT_THAT(layout, IsOk());
    layout_ = *layout;
    // The whole object's tables are several times the small bound.
    ASSERT_GT(codec::CopiedTablesBytes(layout_.tiles, layout_.escapes), 4 * kSmallPartTablesBytes);
    pieces_ = std::make_unique<OnePiece>(encoded_ + layout_.encoded_bytes);
    copier_ = std::make_unique<ChunkedCopier>(*device_, *pieces_, 1 << 20);
  }

  // Copies and decodes the object in host memory with tables parts of at most
  // `part_tables_bytes`; the decoded bytes, and the decode's verdict.
  std::vector<uint8_t> Decode(uint64_t part_tables_bytes, absl::Status* checked) {
    CompressedCopies copies(*device_, *copier_,
                            2 * part_tables_bytes + 2 * CompressedCopies::kMinPieceBytes,
                            part_tables_bytes);
    auto dst = device_->AllocateSlab(raw_.size());
    EXPECT_THAT(dst, IsOk());
    if (!dst.ok()) return {};
    HostBytes host(encoded_, raw_.size(), *pieces_, [] {}, layout_);
    absl::StatusOr<CompressedCopies::Enqueued> enqueued =
        copies.Enqueue(*stream_, host, static_cast<uint8_t*>((*dst)->data()));
    EXPECT_THAT(enqueued, IsOk());
    if (!enqueued.ok()) return {};
    EXPECT_THAT(device_->SynchronizeStream(*enqueued->done_on), IsOk());
    *checked = copies.TakeVerdict(enqueued->verdict, "w").checked;
    const auto* out = static_cast<const uint8_t*>((*dst)->data());
    return std::vector<uint8_t>(out, out + raw_.size());
  }

  uint32_t EscapeStart(uint64_t tile) const {
    uint32_t start;
    std::memcpy(&start, encoded_ + layout_.escape_starts_offset + 4 * tile, sizeof(start));
    return start;
  }
  void SetEscapeStart(uint64_t tile, uint32_t start) {
    std::memcpy(encoded_ + layout_.escape_starts_offset + 4 * tile, &start, sizeof(start));
  }

  std::unique_ptr<Device> host_device_;
  std::unique_ptr<DecodeRecordingDevice> device_;
  std::unique_ptr<Stream> stream_;
  std::vector<uint8_t> raw_;
  std::unique_ptr<PinnedHostBuffer> host_;
  uint8_t* encoded_ = nullptr;
  codec::CompressedLayout layout_{};
  std::unique_ptr<OnePiece> pieces_;
  std::unique_ptr<ChunkedCopier> copier_;
};

TEST_F(CompressedCopiesTest, TablesPastThePartBoundAreDecodedInPartsToTheObjectsBytes) {
  absl::Status checked;
  EXPECT_EQ(Decode(kSmallPartTablesBytes, &checked), raw_);
  EXPECT_THAT(checked, IsOk());
  const std::vector<DecodeRecordingDevice::Decode> decodes = device_->decodes();
  ASSERT_GE(decodes.size(), 4u);
  uint64_t next = 0;
  uint64_t escapes = 0;
  for (const DecodeRecordingDevice::Decode& decode : decodes) {
    EXPECT_EQ(decode.first_tile, next);  // in order, none skipped, none twice
    EXPECT_LE(codec::CopiedTablesBytes(decode.tile_count, decode.escapes_count),
              kSmallPartTablesBytes);
    next += decode.tile_count;
    escapes += decode.escapes_count;
  }
  EXPECT_EQ(next, layout_.tiles);
  EXPECT_EQ(escapes, layout_.escapes);
  // Parts as large as the bound allows: each but the last would not fit its next tile too.
  for (size_t i = 0; i + 1 < decodes.size(); ++i) {
    const uint64_t first = decodes[i].first_tile;
    const uint64_t count = decodes[i].tile_count + 1;
    EXPECT_GT(codec::CopiedTablesBytes(count, EscapeStart(first + count) - EscapeStart(first)),
              kSmallPartTablesBytes)
        << "part " << i << " of " << decodes[i].tile_count << " tiles";
  }
}

TEST_F(CompressedCopiesTest, UnderTheDefaultBoundTheObjectIsOnePart) {
  absl::Status checked;
  EXPECT_EQ(Decode(CompressedCopies::kPartTablesBytes, &checked), raw_);
  EXPECT_THAT(checked, IsOk());
  const std::vector<DecodeRecordingDevice::Decode> decodes = device_->decodes();
  ASSERT_EQ(decodes.size(), 1u);
  EXPECT_EQ(decodes[0].tile_count, layout_.tiles);
  EXPECT_EQ(decodes[0].escapes_count, layout_.escapes);
}

TEST_F(CompressedCopiesTest, EscapeStartsThatLieFailTheDecode) {
  // Past the stream, then backwards, then a run claiming far more than its tiles' words: each a
  // different part's first or inner tile under the small bound.
  for (const auto& [tile, start] :
       {std::pair<uint64_t, uint32_t>{layout_.tiles / 2, 0xfffffff0u},
        {layout_.tiles / 3, 0},
        {layout_.tiles - 1, static_cast<uint32_t>(layout_.escapes)}}) {
    std::vector<uint8_t> saved(encoded_, encoded_ + layout_.data_offset);
    SetEscapeStart(tile, start);
    for (const uint64_t bound : {kSmallPartTablesBytes, CompressedCopies::kPartTablesBytes}) {
      absl::Status checked;
      Decode(bound, &checked);
      EXPECT_THAT(checked, StatusIs(absl::StatusCode::kDataLoss))
          << "tile " << tile << " starting at " << start << ", parts of " << bound;
    }
    std::copy(saved.begin(), saved.end(), encoded_);
    absl::Status checked;
    EXPECT_EQ(Decode(kSmallPartTablesBytes, &checked), raw_);
    EXPECT_THAT(checked, IsOk());
  }
}

}  // namespace
}  // namespace tierd
