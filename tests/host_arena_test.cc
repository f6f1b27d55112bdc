#include "storage/host_arena.h"

#include <atomic>

#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "device/pinned_host_buffer.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kMiB = 1 << 20;

// Pins slowly, and fails from a chosen piece on, to show what the arena does meanwhile.
class SlowPinningDevice : public DeviceWrapper {
 public:
  SlowPinningDevice(Device& target, absl::Duration delay, int fail_from_piece)
      : DeviceWrapper(target), delay_(delay), fail_from_piece_(fail_from_piece) {}
  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    const int piece = pieces_++;
    if (piece >= fail_from_piece_) return absl::ResourceExhaustedError("memlock limit reached");
    if (piece > 0) absl::SleepFor(delay_);
    return DeviceWrapper::RegisterHostMemory(data, bytes);
  }

 private:
  absl::Duration delay_;
  int fail_from_piece_;
  std::atomic<int> pieces_{0};
};

class HostArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
  }
  std::unique_ptr<HostDevice> device_;
};

TEST_F(HostArenaTest, AllocationsArePageAlignedAndFreedSpaceCoalesces) {
  auto arena = HostArena::Create(*device_, {16 * kMiB, 4 * kMiB});
  ASSERT_THAT(arena, IsOk());
  ASSERT_TRUE((*arena)->WaitUntilFullyPinned(absl::Seconds(10)));
  auto a = (*arena)->Allocate(5 * kMiB + 1);
  auto b = (*arena)->Allocate(5 * kMiB);
  auto c = (*arena)->Allocate(5 * kMiB);
  ASSERT_TRUE(a && b && c);
  for (const auto& allocation : {*a, *b, *c}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->data(allocation)) % PageSize(), 0u);
    EXPECT_EQ(allocation.size % PageSize(), 0u);
  }
  EXPECT_EQ(a->size, 5 * kMiB + PageSize());
  // 1 MiB less a page is left: a 2 MiB block does not fit until neighbours are freed.
  EXPECT_FALSE((*arena)->Allocate(2 * kMiB).has_value());
  (*arena)->Free(*b);
  EXPECT_FALSE((*arena)->Allocate(6 * kMiB).has_value());
  (*arena)->Free(*a);
  auto merged = (*arena)->Allocate(10 * kMiB);
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(merged->offset, 0u);
  (*arena)->Free(*merged);
  (*arena)->Free(*c);
  EXPECT_EQ((*arena)->used_bytes(), 0u);
  EXPECT_EQ((*arena)->largest_free_block(), 16 * kMiB);
}

TEST_F(HostArenaTest, IsUsableBeforeTheBackgroundPinningFinishes) {
  SlowPinningDevice slow(*device_, absl::Milliseconds(100), /*fail_from_piece=*/1000);
  auto arena = HostArena::Create(slow, {8 * kMiB, 1 * kMiB});
  ASSERT_THAT(arena, IsOk());
  // Only the first piece is pinned when Create returns, and it can be used at once.
  EXPECT_LT((*arena)->pinned_bytes(), 8 * kMiB);
  auto early = (*arena)->Allocate(kMiB);
  ASSERT_TRUE(early.has_value());
  EXPECT_TRUE((*arena)->WaitUntilFullyPinned(absl::Seconds(30)));
  EXPECT_EQ((*arena)->pinned_bytes(), 8 * kMiB);
  EXPECT_TRUE((*arena)->Allocate(7 * kMiB).has_value());
  EXPECT_THAT((*arena)->pin_status(), IsOk());
}

TEST_F(HostArenaTest, APieceThatFailsToPinLeavesThePinnedPartInService) {
  SlowPinningDevice failing(*device_, absl::ZeroDuration(), /*fail_from_piece=*/3);
  auto arena = HostArena::Create(failing, {8 * kMiB, 1 * kMiB});
  ASSERT_THAT(arena, IsOk());
  EXPECT_FALSE((*arena)->WaitUntilFullyPinned(absl::Seconds(30)));
  EXPECT_EQ((*arena)->pinned_bytes(), 3 * kMiB);
  EXPECT_THAT((*arena)->pin_status(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE((*arena)->Allocate(3 * kMiB).has_value());
  EXPECT_FALSE((*arena)->Allocate(kMiB).has_value());
}

TEST_F(HostArenaTest, FirstPieceThatFailsToPinFailsCreate) {
  SlowPinningDevice failing(*device_, absl::ZeroDuration(), /*fail_from_piece=*/0);
  EXPECT_THAT(HostArena::Create(failing, {8 * kMiB, 1 * kMiB}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(HostArena::Create(*device_, {0, kMiB}), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tierd
