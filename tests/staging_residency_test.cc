// StagingResidency on its own: LRU eviction that spares what is held, allocation requests that wait
// for room or are refused at once, and staging ranges that go back to the pool with their owner.
#include "gpu/detail/staging_residency.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kSlotBytes = 64 << 10;

class StagingResidencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    auto catalog = Catalog::Open(absl::StrCat(dir_.path(), "/state"));
    ASSERT_THAT(catalog, IsOk());
    catalog_ = *std::move(catalog);
    auto pool = StagingPool::Create(*device_, 3 * kSlotBytes, kSlotBytes);
    ASSERT_THAT(pool, IsOk());
    pool_ = *std::move(pool);
    events_ = std::make_unique<EventPool>(*device_, 16);
    residency_ = std::make_unique<StagingResidency>(mu_, *device_, *catalog_, *pool_, *events_,
                                                    stats_, std::make_shared<Liveness>(),
                                                    [this] { return drains_pending_; });
  }

  // Lists a resident stored object `name` in a slot of its own, most recently used.
  StagingObject* AddResident(const std::string& name) {
    absl::MutexLock lock(&mu_);
    std::optional<StagingAllocation> memory = residency_->TryAllocate(kSlotBytes);
    EXPECT_TRUE(memory.has_value());
    StagingObject* object = residency_->Create(absl::StrCat("s/", name));
    object->size = kSlotBytes;
    object->memory = std::move(memory);
    object->state = StagingObject::State::kResident;
    residency_->List(object);
    residency_->Enqueue(object);
    return object;
  }

  bool Listed(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return residency_->Listed(absl::StrCat("s/", name)) != nullptr;
  }

  // Allocates a slot; the answer lands in `answer` once the calls deferred past the lock run.
  void Allocate(absl::StatusOr<StagingAllocation>& answer, bool& answered) {
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    residency_->Allocate(
        kSlotBytes,
        [&answer, &answered](absl::StatusOr<StagingAllocation> memory) {
          answer = std::move(memory);
          answered = true;
        },
        deferred.calls());
  }

  testing::TempDir dir_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<StagingPool> pool_;
  std::unique_ptr<EventPool> events_;
  absl::Mutex mu_;
  GpuTierStats stats_;
  bool drains_pending_ = false;
  std::unique_ptr<StagingResidency> residency_;
};

TEST_F(StagingResidencyTest, EvictsTheLeastRecentlyUsedFirst) {
  StagingObject* a = AddResident("a");
  AddResident("b");
  AddResident("c");
  {
    absl::MutexLock lock(&mu_);
    residency_->Touch(a);
    ASSERT_TRUE(residency_->TryAllocate(kSlotBytes).has_value());
  }
  EXPECT_TRUE(Listed("a"));
  EXPECT_FALSE(Listed("b"));
  EXPECT_TRUE(Listed("c"));
  EXPECT_EQ(stats_.evictions, 1u);
}

TEST_F(StagingResidencyTest, NeverEvictsWhatIsLeasedPinnedOrCopying) {
  StagingObject* a = AddResident("a");
  StagingObject* b = AddResident("b");
  StagingObject* c = AddResident("c");
  absl::MutexLock lock(&mu_);
  a->refs = 1;
  b->pins = 1;
  c->copying = true;
  EXPECT_FALSE(residency_->TryAllocate(kSlotBytes).has_value());
  EXPECT_EQ(residency_->listed_count(), 3u);
  c->copying = false;
  EXPECT_TRUE(residency_->TryAllocate(kSlotBytes).has_value());
  EXPECT_EQ(residency_->Listed("s/c"), nullptr);
  a->refs = 0;
  b->pins = 0;
}

TEST_F(StagingResidencyTest, RefusesAtOnceWhenNothingWillFreeRoom) {
  std::vector<StagingObject*> leased;
  for (const char* name : {"a", "b", "c"}) leased.push_back(AddResident(name));
  for (StagingObject* object : leased) object->refs = 1;
  absl::StatusOr<StagingAllocation> answer = absl::UnknownError("none");
  bool answered = false;
  Allocate(answer, answered);
  EXPECT_TRUE(answered);
  EXPECT_THAT(answer, StatusIs(absl::StatusCode::kResourceExhausted));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(residency_->allocation_waiters(), 0u);
  for (StagingObject* object : leased) object->refs = 0;
}

TEST_F(StagingResidencyTest, WaiterIsAnsweredWhenAReleaseFreesRoom) {
  StagingObject* a = AddResident("a");
  StagingObject* b = AddResident("b");
  StagingObject* c = AddResident("c");
  a->refs = b->refs = c->refs = 1;
  drains_pending_ = true;  // a release is draining
  absl::StatusOr<StagingAllocation> answer = absl::UnknownError("none");
  bool answered = false;
  Allocate(answer, answered);
  EXPECT_FALSE(answered);
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(residency_->allocation_waiters(), 1u);
    // The drain of a's lease completes.
    a->refs = 0;
    drains_pending_ = false;
    residency_->RetryAllocations(deferred.calls());
  }
  EXPECT_TRUE(answered);
  EXPECT_THAT(answer, IsOk());
  EXPECT_FALSE(Listed("a"));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(residency_->allocation_waiters(), 0u);
  b->refs = c->refs = 0;
}

TEST_F(StagingResidencyTest, WaitersAreServedInOrder) {
  StagingObject* a = AddResident("a");
  StagingObject* b = AddResident("b");
  StagingObject* c = AddResident("c");
  a->refs = b->refs = c->refs = 1;
  drains_pending_ = true;
  absl::StatusOr<StagingAllocation> first = absl::UnknownError("none");
  absl::StatusOr<StagingAllocation> second = absl::UnknownError("none");
  bool first_answered = false, second_answered = false;
  Allocate(first, first_answered);
  Allocate(second, second_answered);
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(residency_->allocation_waiters(), 2u);
    a->refs = 0;
    residency_->RetryAllocations(deferred.calls());
  }
  EXPECT_TRUE(first_answered);
  EXPECT_THAT(first, IsOk());
  EXPECT_FALSE(second_answered);
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    drains_pending_ = false;  // nothing more will come: the second is refused
    residency_->RetryAllocations(deferred.calls());
  }
  EXPECT_TRUE(second_answered);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kResourceExhausted));
  b->refs = c->refs = 0;
}

TEST_F(StagingResidencyTest, AStagingAllocationFreesItsRangeWhenItGoesUnlessReleased) {
  std::optional<StagingAllocation> first = pool_->Allocate(kSlotBytes);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(pool_->used_bytes(), kSlotBytes);
  StagingAllocation moved = *std::move(first);
  first.reset();  // the moved-from handle owns nothing
  EXPECT_EQ(pool_->used_bytes(), kSlotBytes);
  EXPECT_EQ(moved.size(), kSlotBytes);
  moved.reset();
  EXPECT_EQ(pool_->used_bytes(), 0u);
  std::optional<StagingAllocation> retired = pool_->Allocate(kSlotBytes);
  ASSERT_TRUE(retired.has_value());
  const StagingRange range = retired->release();
  EXPECT_EQ(range.size, kSlotBytes);
  retired.reset();
  EXPECT_EQ(pool_->used_bytes(), kSlotBytes);  // never handed out again
}

TEST_F(StagingResidencyTest, ARemovedObjectKeepsItsRangeUntilItsLastUseEnds) {
  StagingObject* a = AddResident("a");
  absl::MutexLock lock(&mu_);
  a->refs = 1;
  residency_->Remove(a);
  EXPECT_EQ(residency_->Listed("s/a"), nullptr);
  EXPECT_EQ(pool_->used_bytes(), kSlotBytes);
  a->refs = 0;
  residency_->FreeIfUnused(a);
  EXPECT_EQ(pool_->used_bytes(), 0u);
}

}  // namespace
}  // namespace tierd
