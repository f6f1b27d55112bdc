// The host arena pinned by several threads: every piece once, allocations only from pinned pieces
// while pieces finish out of order, a failing piece, and the arena destroyed mid-pinning. Also
// the page-level helpers those threads use (storage/host/detail/arena_pages.h).
#include <sys/mman.h>

#include <atomic>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "device/pinned_host_buffer.h"
#include "gtest/gtest.h"
#include "storage/host/detail/arena_pages.h"
#include "storage/host/host_arena.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;
constexpr absl::Duration kTimeout = absl::Seconds(30);

// Records every registration and unregistration by address, and can slow registrations down.
class RecordingPinDevice : public DeviceWrapper {
 public:
  explicit RecordingPinDevice(Device& target) : DeviceWrapper(target) {}

  // REQUIRES: set before the arena is created.
  void set_delay(absl::Duration delay) { delay_ = delay; }

  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    if (delay_ > absl::ZeroDuration()) absl::SleepFor(delay_);
    RETURN_IF_ERROR(DeviceWrapper::RegisterHostMemory(data, bytes));
    absl::MutexLock lock(&mu_);
    ++registered_[data];
    ranges_[static_cast<uint8_t*>(data)] = bytes;
    return absl::OkStatus();
  }
  absl::Status UnregisterHostMemory(void* data) override {
    RETURN_IF_ERROR(DeviceWrapper::UnregisterHostMemory(data));
    absl::MutexLock lock(&mu_);
    ++unregistered_[data];
    return absl::OkStatus();
  }

  std::map<const void*, int> registered() const {
    absl::MutexLock lock(&mu_);
    return registered_;
  }
  std::map<const void*, int> unregistered() const {
    absl::MutexLock lock(&mu_);
    return unregistered_;
  }
  // True when [data, data + bytes) lies within registered ranges (adjacent ones together).
  bool Covers(const uint8_t* data, uint64_t bytes) const {
    absl::MutexLock lock(&mu_);
    const uint8_t* end = data + bytes;
    while (data < end) {
      auto range = ranges_.upper_bound(data);
      if (range == ranges_.begin()) return false;
      --range;
      if (range->first + range->second <= data) return false;
      data = range->first + range->second;
    }
    return true;
  }

 private:
  absl::Duration delay_ = absl::ZeroDuration();
  mutable absl::Mutex mu_;
  std::map<const void*, int> registered_ ABSL_GUARDED_BY(mu_);
  std::map<const void*, int> unregistered_ ABSL_GUARDED_BY(mu_);
  std::map<const uint8_t*, uint64_t> ranges_ ABSL_GUARDED_BY(mu_);
};

class HostArenaPinningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    host_ = *std::move(device);
    device_ = std::make_unique<RecordingPinDevice>(*host_);
  }
  std::unique_ptr<HostDevice> host_;
  std::unique_ptr<RecordingPinDevice> device_;
};

TEST_F(HostArenaPinningTest, SeveralThreadsPinEveryPieceExactlyOnce) {
  device_->set_delay(absl::Milliseconds(2));
  HostArenaOptions options{8 * kMiB, 256 * kKiB};
  options.pin_threads = 4;
  auto arena = HostArena::Create(*device_, options);
  ASSERT_THAT(arena, IsOk());
  std::atomic<int> listener_calls{0};
  (*arena)->SetPinListener([&] { ++listener_calls; });
  EXPECT_EQ((*arena)->pin_threads(), 4);
  ASSERT_TRUE((*arena)->WaitUntilFullyPinned(kTimeout));
  EXPECT_EQ((*arena)->pinned_bytes(), 8 * kMiB);
  EXPECT_FALSE((*arena)->pinning());
  EXPECT_THAT((*arena)->pin_status(), IsOk());
  const std::map<const void*, int> registered = device_->registered();
  ASSERT_EQ(registered.size(), 32u);
  for (uint64_t offset = 0; offset < 8 * kMiB; offset += 256 * kKiB) {
    auto piece = registered.find((*arena)->base() + offset);
    ASSERT_NE(piece, registered.end()) << "piece at " << offset << " never pinned";
    EXPECT_EQ(piece->second, 1) << "piece at " << offset;
  }
  EXPECT_TRUE((*arena)->Allocate(8 * kMiB).has_value());
  (*arena)->SetPinListener(nullptr);
  // Every piece after the first, and once more when pinning ended; the listener was set after
  // Create, so some of those calls may have come before it.
  EXPECT_LE(listener_calls.load(), 32);
  arena->reset();
  EXPECT_EQ(device_->unregistered(), registered);
}

TEST_F(HostArenaPinningTest, AllocationsComeOnlyFromPinnedPiecesWhilePiecesFinishOutOfOrder) {
  // Pieces are registered at the arena's own addresses, unknown before Create: hold them by the
  // order in which they are handed out instead, which is the order of their offsets.
  class HoldingDevice : public DeviceWrapper {
   public:
    explicit HoldingDevice(Device& target) : DeviceWrapper(target) {}
    absl::Status RegisterHostMemory(void* data, size_t bytes) override {
      {
        absl::MutexLock lock(&mu_);
        if (base_ == nullptr) base_ = static_cast<uint8_t*>(data);
        const uint64_t index = (static_cast<uint8_t*>(data) - base_) / kMiB;
        if (index == 2 || index == 5) mu_.Await(absl::Condition(&released_));
      }
      return DeviceWrapper::RegisterHostMemory(data, bytes);
    }
    void Release() {
      absl::MutexLock lock(&mu_);
      released_ = true;
    }

   private:
    absl::Mutex mu_;
    uint8_t* base_ ABSL_GUARDED_BY(mu_) = nullptr;  // the first piece's address
    bool released_ ABSL_GUARDED_BY(mu_) = false;
  };
  HoldingDevice holding(static_cast<Device&>(*device_));
  HostArenaOptions options{8 * kMiB, kMiB};
  options.pin_threads = 4;
  auto arena = HostArena::Create(holding, options);
  ASSERT_THAT(arena, IsOk());
  // Pieces 0, 1, 3, 4, 6 and 7 get pinned; 2 and 5 wait.
  for (absl::Time deadline = absl::Now() + kTimeout;
       (*arena)->pinned_bytes() < 6 * kMiB && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ((*arena)->pinned_bytes(), 6 * kMiB);
  EXPECT_TRUE((*arena)->pinning());
  EXPECT_EQ((*arena)->largest_free_block(), 2 * kMiB);
  EXPECT_FALSE((*arena)->Allocate(3 * kMiB).has_value());
  std::vector<ArenaAllocation> blocks;
  while (std::optional<ArenaAllocation> block = (*arena)->Allocate(256 * kKiB)) {
    EXPECT_TRUE(device_->Covers((*arena)->data(*block), block->size()))
        << "allocation at " << block->offset() << " is not in a pinned piece";
    blocks.push_back(*std::move(block));
  }
  EXPECT_EQ(blocks.size(), 24u);
  EXPECT_EQ((*arena)->used_bytes(), 6 * kMiB);

  holding.Release();
  ASSERT_TRUE((*arena)->WaitUntilFullyPinned(kTimeout));
  EXPECT_EQ((*arena)->pinned_bytes(), 8 * kMiB);
  // The two late pieces are not neighbours: each serves on its own.
  EXPECT_EQ((*arena)->largest_free_block(), kMiB);
  for (int i = 0; i < 2; ++i) {
    std::optional<ArenaAllocation> late = (*arena)->Allocate(kMiB);
    ASSERT_TRUE(late.has_value());
    EXPECT_TRUE(late->offset() == 2 * kMiB || late->offset() == 5 * kMiB) << late->offset();
    blocks.push_back(*std::move(late));
  }
  blocks.clear();
  EXPECT_EQ((*arena)->largest_free_block(), 8 * kMiB);
}

TEST_F(HostArenaPinningTest, DestroyingTheArenaWhilePinningUnregistersExactlyThePiecesPinned) {
  device_->set_delay(absl::Milliseconds(5));
  HostArenaOptions options{4 * kMiB, 64 * kKiB};  // 64 pieces, some 80 ms of registering
  options.pin_threads = 4;
  auto arena = HostArena::Create(*device_, options);
  ASSERT_THAT(arena, IsOk());
  absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE((*arena)->pinning());
  arena->reset();
  const std::map<const void*, int> registered = device_->registered();
  EXPECT_LT(registered.size(), 64u) << "pinning did not stop";
  EXPECT_GE(registered.size(), 1u);
  for (const auto& [piece, times] : registered) EXPECT_EQ(times, 1);
  EXPECT_EQ(device_->unregistered(), registered);
}

TEST_F(HostArenaPinningTest, AFailingPieceStopsPinningAndOnlyRegisteredPiecesAreUnregistered) {
  // The fifth registration fails, whichever piece it is for.
  class FailingFifthDevice : public DeviceWrapper {
   public:
    explicit FailingFifthDevice(Device& target) : DeviceWrapper(target) {}
    absl::Status RegisterHostMemory(void* data, size_t bytes) override {
      absl::SleepFor(absl::Milliseconds(5));
      if (++calls_ == 5) return absl::ResourceExhaustedError("memlock limit reached");
      return DeviceWrapper::RegisterHostMemory(data, bytes);
    }

   private:
    std::atomic<int> calls_{0};
  };
  FailingFifthDevice failing(static_cast<Device&>(*device_));
  HostArenaOptions options{4 * kMiB, 64 * kKiB};  // 64 pieces
  options.pin_threads = 4;
  auto arena = HostArena::Create(failing, options);
  ASSERT_THAT(arena, IsOk());
  EXPECT_FALSE((*arena)->WaitUntilFullyPinned(kTimeout));
  EXPECT_FALSE((*arena)->pinning());
  EXPECT_THAT((*arena)->pin_status(), StatusIs(absl::StatusCode::kResourceExhausted));
  const std::map<const void*, int> registered = device_->registered();
  // The pieces other threads had under way when the fifth failed may finish, but no piece is
  // started once the failure is known: far fewer than the 64 are tried.
  EXPECT_GE(registered.size(), 4u);
  EXPECT_LT(registered.size(), 16u);
  EXPECT_EQ((*arena)->pinned_bytes(), registered.size() * 64 * kKiB);
  // All of the pinned part serves, and nothing beyond it.
  std::vector<ArenaAllocation> blocks;
  while (std::optional<ArenaAllocation> block = (*arena)->Allocate(64 * kKiB)) {
    EXPECT_TRUE(device_->Covers((*arena)->data(*block), block->size()));
    blocks.push_back(*std::move(block));
  }
  EXPECT_EQ(blocks.size(), registered.size());
  blocks.clear();
  arena->reset();
  EXPECT_EQ(device_->unregistered(), registered);
}

class HostArenaPrefaultTest : public HostArenaPinningTest,
                              public ::testing::WithParamInterface<std::pair<PagePrefault, bool>> {
};

TEST_P(HostArenaPrefaultTest, PinsTheWholeArenaWithEveryPrefaultAndPageSize) {
  const auto [prefault, huge_pages] = GetParam();
  HostArenaOptions options{8 * kMiB, 2 * kMiB};
  options.pin_threads = 3;
  options.prefault = prefault;
  options.huge_pages = huge_pages;
  auto arena = HostArena::Create(*device_, options);
  ASSERT_THAT(arena, IsOk());
  ASSERT_TRUE((*arena)->WaitUntilFullyPinned(kTimeout));
  std::optional<ArenaAllocation> all = (*arena)->Allocate(8 * kMiB);
  ASSERT_TRUE(all.has_value());
  uint8_t* data = (*arena)->data(*all);
  EXPECT_EQ(data[0], 0);
  EXPECT_EQ(data[8 * kMiB - 1], 0);
  data[8 * kMiB - 1] = 7;
  EXPECT_EQ(data[8 * kMiB - 1], 7);
}

INSTANTIATE_TEST_SUITE_P(PrefaultAndHugePages, HostArenaPrefaultTest,
                         ::testing::Values(std::pair{PagePrefault::kNone, true},
                                           std::pair{PagePrefault::kPopulate, true},
                                           std::pair{PagePrefault::kTouch, true},
                                           std::pair{PagePrefault::kPopulate, false}));

// Pages of `data` resident in memory, by mincore.
uint64_t ResidentPages(uint8_t* data, uint64_t bytes) {
  std::vector<unsigned char> resident(bytes / PageSize());
  EXPECT_EQ(::mincore(data, bytes, resident.data()), 0);
  uint64_t count = 0;
  for (unsigned char page : resident) count += page & 1;
  return count;
}

TEST(ArenaPagesTest, PrefaultMakesEveryPageResident) {
  for (PagePrefault prefault : {PagePrefault::kPopulate, PagePrefault::kTouch}) {
    const uint64_t bytes = 4 * kMiB;
    auto region = MapArenaRegion(bytes);
    ASSERT_THAT(region, IsOk());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*region) % kHugePageBytes, 0u);
    EXPECT_EQ(ResidentPages(*region, bytes), 0u);
    ASSERT_THAT(PrefaultPages(*region, bytes, prefault), IsOk());
    EXPECT_EQ(ResidentPages(*region, bytes), bytes / PageSize()) << PagePrefaultName(prefault);
    EXPECT_EQ((*region)[bytes - 1], 0);
    UnmapArenaRegion(*region, bytes);
  }
}

TEST(ArenaPagesTest, PrefaultNamesRoundTrip) {
  for (PagePrefault prefault :
       {PagePrefault::kNone, PagePrefault::kPopulate, PagePrefault::kTouch}) {
    EXPECT_EQ(ParsePagePrefault(PagePrefaultName(prefault)), prefault);
  }
  EXPECT_EQ(ParsePagePrefault("eager"), std::nullopt);
}

}  // namespace
}  // namespace tierd
