// StagingResidency on its own: LRU eviction that spares what is held, allocation requests that wait
// for room or are refused at once, and staging ranges that go back to the pool with their owner.
#include "gpu/detail/staging_residency.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_parts_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::GpuParts;
using ::tierd::testing::GpuPartsOptions;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kSlotBytes = 64 << 10;

class StagingResidencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GpuPartsOptions options;
    options.pool_bytes = 3 * kSlotBytes;
    options.slab_bytes = kSlotBytes;
    options.drains_pending = [this] { return drains_pending_; };
    auto parts = GpuParts::Create(options);
    ASSERT_THAT(parts, IsOk());
    parts_ = *std::move(parts);
  }

  // Lists a resident stored object `name` in a slot of its own, most recently used.
  StagingObject* AddResident(const std::string& name) {
    absl::MutexLock lock(&parts_->mu);
    std::optional<StagingAllocation> memory = parts_->residency().TryAllocate(kSlotBytes);
    EXPECT_TRUE(memory.has_value());
    StagingObject* object = parts_->residency().Create(absl::StrCat("s/", name));
    object->size = kSlotBytes;
    object->memory = std::move(memory);
    object->state = StagingObject::State::kResident;
    parts_->residency().List(object);
    parts_->residency().Enqueue(object);
    return object;
  }

  bool Listed(const std::string& name) {
    absl::MutexLock lock(&parts_->mu);
    return parts_->residency().Listed(absl::StrCat("s/", name)) != nullptr;
  }

  // Allocates a slot; the answer lands in `answer` once the calls deferred past the lock run.
  void Allocate(absl::StatusOr<StagingAllocation>& answer, bool& answered) {
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_->mu);
    parts_->residency().Allocate(
        kSlotBytes,
        [&answer, &answered](absl::StatusOr<StagingAllocation> memory) {
          answer = std::move(memory);
          answered = true;
        },
        deferred.calls());
  }

  bool drains_pending_ = false;
  std::unique_ptr<GpuParts> parts_;
};

TEST_F(StagingResidencyTest, EvictsTheLeastRecentlyUsedFirst) {
  StagingObject* a = AddResident("a");
  AddResident("b");
  AddResident("c");
  {
    absl::MutexLock lock(&parts_->mu);
    parts_->residency().Touch(a);
    ASSERT_TRUE(parts_->residency().TryAllocate(kSlotBytes).has_value());
  }
  EXPECT_TRUE(Listed("a"));
  EXPECT_FALSE(Listed("b"));
  EXPECT_TRUE(Listed("c"));
  absl::MutexLock lock(&parts_->mu);
  EXPECT_EQ(parts_->stats.evictions, 1u);
}

TEST_F(StagingResidencyTest, NeverEvictsWhatIsLeasedPinnedOrCopying) {
  StagingObject* a = AddResident("a");
  StagingObject* b = AddResident("b");
  StagingObject* c = AddResident("c");
  absl::MutexLock lock(&parts_->mu);
  a->refs = 1;
  b->pins = 1;
  c->copying = true;
  EXPECT_FALSE(parts_->residency().TryAllocate(kSlotBytes).has_value());
  EXPECT_EQ(parts_->residency().listed_count(), 3u);
  c->copying = false;
  EXPECT_TRUE(parts_->residency().TryAllocate(kSlotBytes).has_value());
  EXPECT_EQ(parts_->residency().Listed("s/c"), nullptr);
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
  absl::MutexLock lock(&parts_->mu);
  EXPECT_EQ(parts_->residency().allocation_waiters(), 0u);
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
    absl::MutexLock lock(&parts_->mu);
    EXPECT_EQ(parts_->residency().allocation_waiters(), 1u);
    // The drain of a's lease completes.
    a->refs = 0;
    drains_pending_ = false;
    parts_->residency().RetryAllocations(deferred.calls());
  }
  EXPECT_TRUE(answered);
  EXPECT_THAT(answer, IsOk());
  EXPECT_FALSE(Listed("a"));
  absl::MutexLock lock(&parts_->mu);
  EXPECT_EQ(parts_->residency().allocation_waiters(), 0u);
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
    absl::MutexLock lock(&parts_->mu);
    EXPECT_EQ(parts_->residency().allocation_waiters(), 2u);
    a->refs = 0;
    parts_->residency().RetryAllocations(deferred.calls());
  }
  EXPECT_TRUE(first_answered);
  EXPECT_THAT(first, IsOk());
  EXPECT_FALSE(second_answered);
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_->mu);
    drains_pending_ = false;  // nothing more will come: the second is refused
    parts_->residency().RetryAllocations(deferred.calls());
  }
  EXPECT_TRUE(second_answered);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kResourceExhausted));
  b->refs = c->refs = 0;
}

TEST_F(StagingResidencyTest, AStagingAllocationFreesItsRangeWhenItGoesUnlessReleased) {
  std::optional<StagingAllocation> first = parts_->pool().Allocate(kSlotBytes);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(parts_->pool().used_bytes(), kSlotBytes);
  StagingAllocation moved = *std::move(first);
  first.reset();  // the moved-from handle owns nothing
  EXPECT_EQ(parts_->pool().used_bytes(), kSlotBytes);
  EXPECT_EQ(moved.size(), kSlotBytes);
  moved.reset();
  EXPECT_EQ(parts_->pool().used_bytes(), 0u);
  std::optional<StagingAllocation> retired = parts_->pool().Allocate(kSlotBytes);
  ASSERT_TRUE(retired.has_value());
  const StagingRange range = retired->release();
  EXPECT_EQ(range.size, kSlotBytes);
  retired.reset();
  EXPECT_EQ(parts_->pool().used_bytes(), kSlotBytes);  // never handed out again
}

TEST_F(StagingResidencyTest, ARemovedObjectKeepsItsRangeUntilItsLastUseEnds) {
  StagingObject* a = AddResident("a");
  absl::MutexLock lock(&parts_->mu);
  a->refs = 1;
  parts_->residency().Remove(a);
  EXPECT_EQ(parts_->residency().Listed("s/a"), nullptr);
  EXPECT_EQ(parts_->pool().used_bytes(), kSlotBytes);
  a->refs = 0;
  parts_->residency().FreeIfUnused(a);
  EXPECT_EQ(parts_->pool().used_bytes(), 0u);
}

}  // namespace
}  // namespace tierd
