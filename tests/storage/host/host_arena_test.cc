#include "storage/host/host_arena.h"

#include <atomic>
#include <optional>
#include <utility>

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
  for (const ArenaAllocation* allocation : {&*a, &*b, &*c}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->data(*allocation)) % PageSize(), 0u);
    EXPECT_EQ(allocation->size() % PageSize(), 0u);
  }
  EXPECT_EQ(a->size(), 5 * kMiB + PageSize());
  // 1 MiB less a page is left: a 2 MiB block does not fit until neighbours are freed.
  EXPECT_FALSE((*arena)->Allocate(2 * kMiB).has_value());
  b.reset();
  EXPECT_FALSE((*arena)->Allocate(6 * kMiB).has_value());
  a.reset();
  auto merged = (*arena)->Allocate(10 * kMiB);
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(merged->offset(), 0u);
  merged.reset();
  c.reset();
  EXPECT_EQ((*arena)->used_bytes(), 0u);
  EXPECT_EQ((*arena)->largest_free_block(), 16 * kMiB);
}

TEST_F(HostArenaTest, AnAllocationGoesBackToTheArenaWhenItsHandleGoes) {
  auto arena = HostArena::Create(*device_, {4 * kMiB, 4 * kMiB});
  ASSERT_THAT(arena, IsOk());
  {
    std::optional<ArenaAllocation> block = (*arena)->Allocate(kMiB);
    ASSERT_TRUE(block.has_value());
    EXPECT_EQ((*arena)->used_bytes(), kMiB);
  }
  EXPECT_EQ((*arena)->used_bytes(), 0u);
  EXPECT_EQ((*arena)->largest_free_block(), 4 * kMiB);
}

TEST_F(HostArenaTest, MovingAnAllocationMovesItsOwnershipAndFreesItOnce) {
  auto arena = HostArena::Create(*device_, {4 * kMiB, 4 * kMiB});
  ASSERT_THAT(arena, IsOk());
  std::optional<ArenaAllocation> first = (*arena)->Allocate(kMiB);
  ASSERT_TRUE(first.has_value());
  const uint64_t offset = first->offset();
  ArenaAllocation moved = *std::move(first);
  // The moved-from handle is empty: destroying it frees nothing.
  EXPECT_EQ(first->size(), 0u);
  first.reset();
  EXPECT_EQ((*arena)->used_bytes(), kMiB);
  EXPECT_EQ(moved.offset(), offset);
  EXPECT_EQ(moved.size(), kMiB);

  // Assigning over a handle frees the block it held.
  std::optional<ArenaAllocation> second = (*arena)->Allocate(2 * kMiB);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ((*arena)->used_bytes(), 3 * kMiB);
  moved = *std::move(second);
  EXPECT_EQ((*arena)->used_bytes(), 2 * kMiB);
  moved.reset();
  EXPECT_EQ(moved.size(), 0u);
  moved.reset();  // a second reset frees nothing more
  EXPECT_EQ((*arena)->used_bytes(), 0u);
}

TEST_F(HostArenaTest, AnEmptyAllocationTakesNothing) {
  auto arena = HostArena::Create(*device_, {4 * kMiB, 4 * kMiB});
  ASSERT_THAT(arena, IsOk());
  std::optional<ArenaAllocation> empty = (*arena)->Allocate(0);
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_EQ((*arena)->used_bytes(), 0u);
  empty.reset();
  EXPECT_EQ((*arena)->used_bytes(), 0u);
  EXPECT_EQ((*arena)->largest_free_block(), 4 * kMiB);
}

TEST_F(HostArenaTest, PiecesAreCountedFromItsBase) {
  auto arena = HostArena::Create(*device_, {2 << 20, 1 << 20});
  ASSERT_THAT(arena, IsOk());
  const PinnedPieceBoundaries& pieces = **arena;
  EXPECT_EQ(pieces.BytesToPieceEnd((*arena)->base()), 1u << 20);
  EXPECT_EQ(pieces.BytesToPieceEnd((*arena)->base() + 10), (1u << 20) - 10);
  EXPECT_EQ(pieces.BytesToPieceEnd((*arena)->base() + (1 << 20)), 1u << 20);
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
  // One pinning thread, so that the pieces pinned before the failure are the first three, in one
  // block (with several, which pieces get there first varies: host_arena_pinning_test.cc).
  auto arena = HostArena::Create(failing, {8 * kMiB, 1 * kMiB, /*pin_threads=*/1});
  ASSERT_THAT(arena, IsOk());
  EXPECT_FALSE((*arena)->WaitUntilFullyPinned(absl::Seconds(30)));
  EXPECT_EQ((*arena)->pinned_bytes(), 3 * kMiB);
  EXPECT_THAT((*arena)->pin_status(), StatusIs(absl::StatusCode::kResourceExhausted));
  std::optional<ArenaAllocation> all_pinned = (*arena)->Allocate(3 * kMiB);
  EXPECT_TRUE(all_pinned.has_value());
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
