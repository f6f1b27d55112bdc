// ChunkedCopier: copies issued in pieces no larger than the chunk, none spanning two pinned pieces
// of host memory, and the bytes all arrive.
#include "gpu/chunked_copier.h"

#include <memory>
#include <vector>

#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;

// Records each copy's source and size.
class RecordingDevice : public DeviceWrapper {
 public:
  using DeviceWrapper::DeviceWrapper;
  absl::Status CopyAsync(Stream& stream, void* dst, const void* src, size_t bytes) override {
    copies.push_back({static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), bytes});
    return DeviceWrapper::CopyAsync(stream, dst, src, bytes);
  }
  absl::Status CopyAsync2D(Stream& stream, void* dst, size_t dst_pitch, const void* src,
                           size_t src_pitch, size_t width, size_t rows) override {
    copies_2d.push_back({static_cast<const uint8_t*>(src), src_pitch, width, rows});
    return DeviceWrapper::CopyAsync2D(stream, dst, dst_pitch, src, src_pitch, width, rows);
  }
  struct Copy {
    const uint8_t* src;
    uint8_t* dst;
    size_t bytes;
  };
  struct Copy2D {
    const uint8_t* src;
    size_t src_pitch;
    size_t width;
    size_t rows;
  };
  std::vector<Copy> copies;
  std::vector<Copy2D> copies_2d;
};

// Pieces of `piece` bytes counted from `base`.
class FixedPieces : public PinnedPieceBoundaries {
 public:
  FixedPieces(const uint8_t* base, uint64_t piece) : base_(base), piece_(piece) {}
  uint64_t BytesToPieceEnd(const uint8_t* host) const override {
    return piece_ - static_cast<uint64_t>(host - base_) % piece_;
  }

 private:
  const uint8_t* base_;
  uint64_t piece_;
};

class ChunkedCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    host_device_ = *std::move(device);
    device_ = std::make_unique<RecordingDevice>(*host_device_);
    auto stream = device_->CreateStream(StreamPriority::kNormal);
    ASSERT_THAT(stream, IsOk());
    stream_ = *std::move(stream);
  }

  std::unique_ptr<Device> host_device_;
  std::unique_ptr<RecordingDevice> device_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(ChunkedCopierTest, NoPieceSpansTwoPinnedPiecesOfTheHostSide) {
  std::vector<uint8_t> host(4096), staging(4096);
  testing::FillPattern(host.data(), host.size(), 5);
  const FixedPieces pieces(host.data(), /*piece=*/1000);
  ChunkedCopier copier(*device_, pieces, /*chunk_bytes=*/300);
  // From host offset 900: pieces end at 1000, 2000, 3000.
  ASSERT_THAT(copier.CopyChunked(*stream_, staging.data(), host.data() + 900, 2500,
                                 /*host_is_dst=*/false),
              IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  uint64_t total = 0;
  for (const RecordingDevice::Copy& copy : device_->copies) {
    EXPECT_LE(copy.bytes, 300u);
    const uint64_t start = static_cast<uint64_t>(copy.src - host.data());
    EXPECT_EQ(start / 1000, (start + copy.bytes - 1) / 1000) << "copy from " << start;
    total += copy.bytes;
  }
  EXPECT_EQ(total, 2500u);
  EXPECT_EQ(device_->copies.front().bytes, 100u);  // up to the first boundary
  std::vector<uint8_t> expected(host.begin() + 900, host.begin() + 3400);
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), staging.begin()));
}

TEST_F(ChunkedCopierTest, HostSideIsTheDestinationWhenCopyingOut) {
  std::vector<uint8_t> host(2048), staging(2048);
  testing::FillPattern(staging.data(), staging.size(), 9);
  const FixedPieces pieces(host.data(), /*piece=*/512);
  ChunkedCopier copier(*device_, pieces, /*chunk_bytes=*/4096);
  ASSERT_THAT(copier.CopyChunked(*stream_, host.data() + 256, staging.data(), 1024,
                                 /*host_is_dst=*/true),
              IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  ASSERT_EQ(device_->copies.size(), 3u);  // 256 to the boundary, 512, 256
  EXPECT_EQ(device_->copies[0].bytes, 256u);
  EXPECT_EQ(device_->copies[1].bytes, 512u);
  EXPECT_EQ(device_->copies[2].bytes, 256u);
  EXPECT_EQ(testing::FirstPatternMismatch(host.data() + 256, 1024, 9), -1);
}

TEST_F(ChunkedCopierTest, PiecesOutsidePinnedMemoryFollowOnlyTheChunk) {
  std::vector<uint8_t> src(1000), dst(1000);
  testing::FillPattern(src.data(), src.size(), 3);
  const FixedPieces pieces(src.data(), /*piece=*/10);  // ignored by CopyInPieces
  ChunkedCopier copier(*device_, pieces, /*chunk_bytes=*/400);
  ASSERT_THAT(copier.CopyInPieces(*stream_, dst.data(), src.data(), 1000), IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  ASSERT_EQ(device_->copies.size(), 3u);
  EXPECT_EQ(device_->copies[2].bytes, 200u);
  EXPECT_EQ(testing::FirstPatternMismatch(dst.data(), 1000, 3), -1);
}

TEST_F(ChunkedCopierTest, StridedRangesLandRowByRowWithinPinnedPiecesAndChunks) {
  // A 40 × 100-byte matrix; the shard is columns [30, 55) of every row, then a whole second
  // tensor of 300 bytes at host offset 4000, landing after it.
  std::vector<uint8_t> host(4300), staging(40 * 25 + 300, 0);
  testing::FillPattern(host.data(), host.size(), 11);
  const FixedPieces pieces(host.data(), /*piece=*/1000);
  ChunkedCopier copier(*device_, pieces, /*chunk_bytes=*/200);
  const std::vector<StridedRange> ranges = {
      StridedRange{30, 100, 0, 25, 25, 40},
      StridedRange{4000, 0, 40 * 25, 300, 300, 1},
  };
  ASSERT_THAT(copier.CopyStrided(*stream_, staging.data(), host.data(), ranges, pieces), IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  std::vector<uint8_t> expected;
  for (int row = 0; row < 40; ++row) {
    expected.insert(expected.end(), host.begin() + row * 100 + 30, host.begin() + row * 100 + 55);
  }
  expected.insert(expected.end(), host.begin() + 4000, host.end());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), staging.begin()));

  uint64_t rows = 0;
  for (const RecordingDevice::Copy2D& copy : device_->copies_2d) {
    EXPECT_EQ(copy.src_pitch, 100u);
    EXPECT_LE(copy.width * copy.rows, 200u) << "a 2-D copy of more than a chunk";
    const uint64_t first = static_cast<uint64_t>(copy.src - host.data());
    const uint64_t last = first + (copy.rows - 1) * copy.src_pitch + copy.width - 1;
    EXPECT_EQ(first / 1000, last / 1000) << "a 2-D copy from " << first << " spans two pieces";
    rows += copy.rows;
  }
  uint64_t one_row = 0;
  for (const RecordingDevice::Copy& copy : device_->copies) {
    const uint64_t start = static_cast<uint64_t>(copy.src - host.data());
    EXPECT_EQ(start / 1000, (start + copy.bytes - 1) / 1000) << "copy from " << start;
    if (start < 4000) one_row += copy.bytes;
  }
  // No row of this matrix crosses a piece boundary (rows start at multiples of 100), so only the
  // last row of a piece's run may go alone.
  EXPECT_EQ(rows * 25 + one_row, 40u * 25);
  EXPECT_GE(device_->copies_2d.size(), 5u);  // at most 8 rows (200 bytes) a copy
}

TEST_F(ChunkedCopierTest, AStridedRowAcrossTwoPinnedPiecesIsSplitThere) {
  // Rows of 60 bytes every 70: the row at 980 crosses the boundary at 1000.
  std::vector<uint8_t> host(2100), staging(30 * 60, 0);
  testing::FillPattern(host.data(), host.size(), 4);
  const FixedPieces pieces(host.data(), /*piece=*/1000);
  ChunkedCopier copier(*device_, pieces, /*chunk_bytes=*/1 << 20);
  const std::vector<StridedRange> ranges = {StridedRange{0, 70, 0, 60, 60, 30}};
  ASSERT_THAT(copier.CopyStrided(*stream_, staging.data(), host.data(), ranges, pieces), IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  for (int row = 0; row < 30; ++row) {
    EXPECT_TRUE(std::equal(host.begin() + row * 70, host.begin() + row * 70 + 60,
                           staging.begin() + row * 60))
        << "row " << row;
  }
  for (const RecordingDevice::Copy2D& copy : device_->copies_2d) {
    const uint64_t first = static_cast<uint64_t>(copy.src - host.data());
    const uint64_t last = first + (copy.rows - 1) * copy.src_pitch + copy.width - 1;
    EXPECT_EQ(first / 1000, last / 1000) << "a 2-D copy from " << first << " spans two pieces";
  }
  bool split = false;
  for (const RecordingDevice::Copy& copy : device_->copies) {
    if (copy.src == host.data() + 980) split = copy.bytes == 20;
  }
  EXPECT_TRUE(split) << "the row at 980 was not cut at the boundary";
}

}  // namespace
}  // namespace tierd
