// The GPU tier loading tensor-parallel shards in-process, on the host device: a strided shard is
// cut out of its whole object in host memory, and read as itself when the whole object does not
// fit the host tier; a shard's layout is derived without the tier's lock.
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "device/device_wrapper.h"
#include "gpu/gpu_tier.h"
#include "gtest/gtest.h"
#include "tests/gpu_tier_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::Answer;
using ::tierd::testing::FetchNow;
using ::tierd::testing::GpuTestStack;
using ::tierd::testing::IsOk;
using ::tierd::testing::kBlockBytes;
using ::tierd::testing::TensorSpec;

// A device whose first copy after Hold() waits until Release(). Copies into staging are enqueued
// under the tier's lock, so while one waits here the lock is held.
class HoldingDevice : public DeviceWrapper {
 public:
  using DeviceWrapper::DeviceWrapper;

  absl::Status CopyAsync(Stream& stream, void* dst, const void* src, size_t bytes) override {
    if (hold_.exchange(false)) {
      held_.Notify();
      released_.WaitForNotification();
    }
    return DeviceWrapper::CopyAsync(stream, dst, src, bytes);
  }

  void Hold() { hold_ = true; }
  // True once a copy waits (the tier's lock held by its caller); false after the test's timeout.
  bool WaitUntilHeld() { return held_.WaitForNotificationWithTimeout(testing::kAnswerTimeout); }
  void Release() { released_.Notify(); }

 private:
  std::atomic<bool> hold_{false};
  absl::Notification held_;
  absl::Notification released_;
};

class GpuTierShardsTest : public ::testing::Test {
 protected:
  void Start() {
    auto stack = GpuTestStack::Create(/*blocks=*/2, [this](Device& host) {
      auto device = std::make_unique<HoldingDevice>(host);
      device_ = device.get();
      return device;
    });
    ASSERT_THAT(stack, IsOk());
    stack_ = *std::move(stack);
    GpuTierOptions options;
    options.pool_bytes = 8 * kBlockBytes;
    options.slab_bytes = 4 * kBlockBytes;
    options.copy_chunk_bytes = 16 << 10;
    options.close_grace = absl::Milliseconds(200);
    ASSERT_THAT(stack_->StartTier(options), IsOk());
    absl::StatusOr<ClientId> client = tier().OpenClient(ClientLimits{});
    ASSERT_THAT(client, IsOk());
    client_ = *client;
  }

  // Registers model `name` of one file holding `tensors`, an object per tensor.
  void Register(const std::string& name, const std::vector<TensorSpec>& tensors) {
    const std::string dir = absl::StrCat(dir_.path(), "/", name);
    std::filesystem::create_directories(dir);
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(dir, "/model.safetensors"), tensors),
                IsOk());
    ASSERT_THAT(stack_->catalog()
                    .RegisterModel(name, dir, Grouping::kTensor, GroupingRules::Defaults(), nullptr)
                    .status(),
                IsOk());
  }

  // Fetches `key` and returns its one tensor's bytes ("" and a failure when it cannot).
  std::string FetchTensor(const std::string& key) {
    absl::StatusOr<LeaseGrant> lease = FetchNow(tier(), client_, key);
    EXPECT_THAT(lease, IsOk()) << key;
    if (!lease.ok()) return "";
    if (lease->ready_event) {
      EXPECT_THAT(stack_->device().SynchronizeEvent(tier().events().event(*lease->ready_event)),
                  IsOk());
    }
    const TensorPlacement& tensor = lease->tensors->at(0);
    std::string bytes(
        reinterpret_cast<const char*>(tier().pool().data(lease->range)) + tensor.offset,
        tensor.size);
    EXPECT_THAT(tier().Release(client_, lease->lease_id, std::nullopt), IsOk());
    return bytes;
  }

  GpuTier& tier() { return *stack_->tier; }

  testing::TempDir dir_;
  HoldingDevice* device_ = nullptr;
  std::unique_ptr<GpuTestStack> stack_;
  ClientId client_ = 0;
};

// Columns of a [256, 1024] F32 weight (1 MiB): each an eighth of every 4 KiB row. The weight is
// read into the host tier once and every shard is copied out of it.
TEST_F(GpuTierShardsTest, AStridedShardIsCutOutOfItsWholeObjectInHostMemory) {
  Start();
  const TensorSpec weight = testing::RandomTensor("w", "F32", {256, 1024}, 5);
  Register("tp", {weight});
  const uint64_t read_before = stack_->host_cache().stats().bytes_from_disk;
  for (uint32_t index = 0; index < 3; ++index) {
    const std::string key = absl::StrCat("tp/w@1:", index, "/8");
    EXPECT_EQ(FetchTensor(key), testing::TensorSplit(weight, 1, index, 8)) << key;
  }
  EXPECT_EQ(stack_->host_cache().stats().bytes_from_disk - read_before, weight.data.size());
  EXPECT_EQ(tier().stats().shards_cut, 3u);
  EXPECT_TRUE(stack_->host_cache().IsResident("tp/w"));
  EXPECT_FALSE(stack_->host_cache().IsResident("tp/w@1:0/8"));
  // A dim-0 shard of an object in host memory already is cut from it too.
  EXPECT_EQ(FetchTensor("tp/w@0:1/8"), testing::TensorSplit(weight, 0, 1, 8));
  EXPECT_EQ(tier().stats().shards_cut, 4u);
}

// A strided shard whose whole object the host tier cannot take (4 MiB, the whole arena) is read as
// itself; a dim-0 shard whose object is not in host memory is read as itself too.
TEST_F(GpuTierShardsTest, AShardIsReadAsItselfWhenItsObjectDoesNotFitOrItIsContiguous) {
  Start();
  const TensorSpec wide = testing::RandomTensor("wide", "F32", {1024, 1024}, 6);
  const TensorSpec rows = testing::RandomTensor("rows", "F32", {64, 1024}, 7);
  Register("big", {wide, rows});
  EXPECT_EQ(FetchTensor("big/wide@1:1/16"), testing::TensorSplit(wide, 1, 1, 16));
  EXPECT_EQ(FetchTensor("big/rows@0:1/2"), testing::TensorSplit(rows, 0, 1, 2));
  EXPECT_EQ(tier().stats().shards_cut, 0u);
  EXPECT_TRUE(stack_->host_cache().IsResident("big/wide@1:1/16"));
  EXPECT_FALSE(stack_->host_cache().IsResident("big/rows"));
}

// A shard's layout is derived before the tier's lock is taken: while another load holds the lock
// (its copy into staging waits in the device), a fetch of a new shard gets its layout derived,
// then waits for the lock.
TEST_F(GpuTierShardsTest, AShardsLayoutIsDerivedWithoutTheTiersLock) {
  Start();
  Answer<absl::StatusOr<LeaseGrant>> block;
  device_->Hold();
  tier().Fetch(client_, GpuTestStack::BlockKey(0), ReadPriority::kDemand, absl::InfiniteFuture(),
               block.Callback());
  ASSERT_TRUE(device_->WaitUntilHeld()) << "the block's copy never started";
  const uint64_t derived = stack_->catalog().shards_derived();
  Answer<absl::StatusOr<LeaseGrant>> shard;
  std::thread asker([&] {
    tier().Fetch(client_, GpuTestStack::BlockKey(1) + "@0:1/2", ReadPriority::kDemand,
                 absl::InfiniteFuture(), shard.Callback());
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (stack_->catalog().shards_derived() == derived && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(stack_->catalog().shards_derived(), derived + 1)
      << "the layout was not derived while the tier's lock was held";
  device_->Release();
  asker.join();
  absl::StatusOr<LeaseGrant> block_lease = block.Wait();
  absl::StatusOr<LeaseGrant> shard_lease = shard.Wait();
  ASSERT_THAT(block_lease, IsOk());
  ASSERT_THAT(shard_lease, IsOk());
  EXPECT_EQ(shard_lease->length, kBlockBytes / 2);
  EXPECT_THAT(tier().Release(client_, block_lease->lease_id, std::nullopt), IsOk());
  EXPECT_THAT(tier().Release(client_, shard_lease->lease_id, std::nullopt), IsOk());
}

}  // namespace
}  // namespace tierd
