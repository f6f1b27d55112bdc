// ScratchRing on the host device: ranges are contiguous, aligned and wrap; the writer waits for
// the reads of what a range overlaps, and only for those; misuse is refused.
#include "gpu/detail/scratch_ring.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kCapacity = 64 << 10;
constexpr uint64_t kGranule = 4 << 10;

class ScratchRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    auto writer = device_->CreateStream(StreamPriority::kNormal);
    ASSERT_THAT(writer, IsOk());
    writer_ = *std::move(writer);
    auto reader = device_->CreateStream(StreamPriority::kHigh);
    ASSERT_THAT(reader, IsOk());
    reader_ = *std::move(reader);
    ring_ = std::make_unique<ScratchRing>(*device_, *writer_, *reader_, memory_.data(), kCapacity,
                                          kGranule);
  }

  void TearDown() override {
    if (!release_reader_.HasBeenNotified()) release_reader_.Notify();  // a failed test's
    EXPECT_THAT(device_->SynchronizeStream(*reader_), IsOk());
    EXPECT_THAT(device_->SynchronizeStream(*writer_), IsOk());
  }

  uint64_t OffsetOf(const uint8_t* range) const {
    return static_cast<uint64_t>(range - memory_.data());
  }

  // Blocks the reader stream until release_reader_; reader_done_ is set after.
  void EnqueueBlockedRead() {
    ASSERT_THAT(device_->LaunchHostFunction(*reader_,
                                            [this] {
                                              release_reader_.WaitForNotification();
                                              reader_done_ = true;
                                            }),
                IsOk());
  }

  // Enqueues on the writer what it would write next: notes whether the blocked read had ended.
  void EnqueueWrite(absl::Notification& written, std::atomic<bool>& saw_reader_done) {
    ASSERT_THAT(device_->LaunchHostFunction(*writer_,
                                            [this, &written, &saw_reader_done] {
                                              saw_reader_done = reader_done_.load();
                                              written.Notify();
                                            }),
                IsOk());
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> writer_;
  std::unique_ptr<Stream> reader_;
  std::vector<uint8_t> memory_ = std::vector<uint8_t>(kCapacity);
  std::unique_ptr<ScratchRing> ring_;
  absl::Notification release_reader_;
  std::atomic<bool> reader_done_{false};
};

TEST_F(ScratchRingTest, RangesAreContiguousAlignedAndWrapAtTheEnd) {
  std::vector<uint64_t> offsets;
  for (uint64_t bytes : {100ull, 8192ull, 40000ull, 20000ull, 1ull}) {
    absl::StatusOr<uint8_t*> range = ring_->Take(bytes);
    ASSERT_THAT(range, IsOk());
    offsets.push_back(OffsetOf(*range));
    ASSERT_THAT(ring_->GiveBack(), IsOk());
  }
  // 100 → 4 KiB at 0; 8 KiB at 4 KiB; 40000 → 40 KiB at 12 KiB (ends at 52 KiB); 20000 → 20 KiB
  // does not fit in the last 12 KiB, so it starts again at 0; 1 byte → 4 KiB at 20 KiB.
  EXPECT_THAT(offsets, ::testing::ElementsAre(0, 4096, 12288, 0, 20480));
  absl::StatusOr<uint8_t*> whole = ring_->Take(kCapacity);
  ASSERT_THAT(whole, IsOk());
  EXPECT_EQ(OffsetOf(*whole), 0u);
  EXPECT_THAT(ring_->GiveBack(), IsOk());
}

TEST_F(ScratchRingTest, TheWriterWaitsForTheReadsOfWhatARangeOverlaps) {
  ASSERT_THAT(ring_->Take(48 << 10), IsOk());
  EnqueueBlockedRead();
  ASSERT_THAT(ring_->GiveBack(), IsOk());
  // The next 32 KiB wrap onto the first range, still being read.
  absl::StatusOr<uint8_t*> range = ring_->Take(32 << 10);
  ASSERT_THAT(range, IsOk());
  EXPECT_EQ(OffsetOf(*range), 0u);
  absl::Notification written;
  std::atomic<bool> saw_reader_done{false};
  EnqueueWrite(written, saw_reader_done);
  EXPECT_FALSE(written.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  release_reader_.Notify();
  ASSERT_TRUE(written.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(saw_reader_done);
  EXPECT_THAT(ring_->GiveBack(), IsOk());
}

TEST_F(ScratchRingTest, ARangeClearOfUnfinishedReadsDoesNotWait) {
  ASSERT_THAT(ring_->Take(16 << 10), IsOk());
  EnqueueBlockedRead();
  ASSERT_THAT(ring_->GiveBack(), IsOk());
  // The rest of the ring: nothing read there yet.
  absl::StatusOr<uint8_t*> range = ring_->Take(48 << 10);
  ASSERT_THAT(range, IsOk());
  EXPECT_EQ(OffsetOf(*range), 16u << 10);
  absl::Notification written;
  std::atomic<bool> saw_reader_done{true};
  EnqueueWrite(written, saw_reader_done);
  ASSERT_TRUE(written.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(saw_reader_done);
  EXPECT_THAT(ring_->GiveBack(), IsOk());
}

TEST_F(ScratchRingTest, MisuseIsRefused) {
  EXPECT_THAT(ring_->GiveBack(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ring_->Take(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ring_->Take(kCapacity + 1), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(ring_->Take(1), IsOk());
  EXPECT_THAT(ring_->Take(1), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ring_->GiveBack(), IsOk());
  EXPECT_THAT(ring_->Take(1), IsOk());
  EXPECT_THAT(ring_->GiveBack(), IsOk());
}

}  // namespace
}  // namespace tierd
