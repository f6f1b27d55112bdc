// HandoffCopies on its own: a staging object is copied into the host handoff buffer only after its
// ready event, the copied event is recorded after the copy, the buffer refuses what does not fit,
// and a range freed "later" comes back once the handoff stream has run.
#include "gpu/detail/handoff_copies.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_parts_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::FillPattern;
using ::tierd::testing::FirstPatternMismatch;
using ::tierd::testing::GpuLoaders;
using ::tierd::testing::GpuParts;
using ::tierd::testing::GpuPartsOptions;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kObjectBytes = 64 << 10;
constexpr absl::Duration kBound = absl::Seconds(10);

class HandoffCopiesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GpuPartsOptions options;
    options.pool_bytes = 4 * kObjectBytes;
    options.slab_bytes = 4 * kObjectBytes;
    auto parts = GpuParts::Create(options);
    ASSERT_THAT(parts, IsOk());
    parts_ = *std::move(parts);
    // Room for two objects in the handoff buffer.
    loaders_ = std::make_unique<GpuLoaders>(*parts_, 2 * kObjectBytes);
    writer_ = parts_->NewStream();
    ASSERT_NE(writer_, nullptr);
  }

  void TearDown() override {
    if (!go_.HasBeenNotified()) go_.Notify();
    if (writer_ != nullptr) {
      EXPECT_THAT(parts_->device().SynchronizeStream(*writer_), IsOk());
    }
    loaders_.reset();
    parts_.reset();
  }

  // A resident object `name` whose staging bytes are pattern `seed`. With `held_back`, the bytes
  // are written on a stream held until go_, and the object's ready event recorded after them.
  StagingObject* AddResident(const std::string& name, uint64_t seed, bool held_back) {
    absl::MutexLock lock(&parts_->mu);
    std::optional<StagingAllocation> memory = parts_->residency().TryAllocate(kObjectBytes);
    EXPECT_TRUE(memory.has_value());
    StagingObject* object = parts_->residency().Create(absl::StrCat("s/", name));
    object->size = kObjectBytes;
    object->memory = std::move(memory);
    object->state = StagingObject::State::kResident;
    auto* staging = static_cast<uint8_t*>(parts_->pool().data(object->memory->range()));
    if (!held_back) {
      FillPattern(staging, kObjectBytes, seed);
    } else {
      absl::StatusOr<uint32_t> ready = parts_->events().Acquire(EventUse::kDaemonRecords);
      EXPECT_THAT(ready, IsOk());
      object->ready_event = *ready;
      EXPECT_THAT(parts_->device().LaunchHostFunction(*writer_,
                                                      [this, staging, seed] {
                                                        go_.WaitForNotificationWithTimeout(kBound);
                                                        FillPattern(staging, kObjectBytes, seed);
                                                      }),
                  IsOk());
      EXPECT_THAT(parts_->device().RecordEvent(parts_->events().event(*ready), *writer_), IsOk());
    }
    parts_->residency().List(object);
    return object;
  }

  absl::StatusOr<uint64_t> CopyOut(const StagingObject& object, uint32_t copied_event) {
    absl::MutexLock lock(&parts_->mu);
    return loaders_->handoff().CopyOut(object, copied_event);
  }

  uint32_t NewEvent() {
    absl::StatusOr<uint32_t> event = parts_->events().Acquire(EventUse::kDaemonRecords);
    EXPECT_THAT(event, IsOk());
    return event.ok() ? *event : 0;
  }

  std::unique_ptr<GpuParts> parts_;
  std::unique_ptr<GpuLoaders> loaders_;
  Stream* writer_ = nullptr;
  absl::Notification go_;
};

TEST_F(HandoffCopiesTest, CopiesTheObjectAfterItsReadyEventAndRecordsTheCopiedEvent) {
  StagingObject* object = AddResident("late", 21, /*held_back=*/true);
  const uint32_t copied = NewEvent();
  absl::StatusOr<uint64_t> offset = CopyOut(*object, copied);
  ASSERT_THAT(offset, IsOk());
  // The copy waits for the object's bytes: the copied event has not completed.
  absl::SleepFor(absl::Milliseconds(50));
  absl::StatusOr<bool> done = parts_->device().QueryEvent(parts_->events().event(copied));
  ASSERT_THAT(done, IsOk());
  EXPECT_FALSE(*done);
  go_.Notify();
  ASSERT_THAT(parts_->device().SynchronizeEvent(parts_->events().event(copied)), IsOk());
  EXPECT_EQ(FirstPatternMismatch(loaders_->buffer().data() + *offset, kObjectBytes, 21), -1);
  EXPECT_EQ(parts_->stats_copy().bytes_gpu_to_host, kObjectBytes);
}

TEST_F(HandoffCopiesTest, WhatDoesNotFitIsRefusedAndARangeFreedLaterComesBack) {
  StagingObject* a = AddResident("a", 1, false);
  StagingObject* b = AddResident("b", 2, false);
  StagingObject* c = AddResident("c", 3, false);
  absl::StatusOr<uint64_t> first = CopyOut(*a, NewEvent());
  absl::StatusOr<uint64_t> second = CopyOut(*b, NewEvent());
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  EXPECT_NE(*first, *second);
  EXPECT_THAT(CopyOut(*c, NewEvent()), StatusIs(absl::StatusCode::kResourceExhausted));

  loaders_->handoff().FreeLater(*first, kObjectBytes);
  // It comes back once the handoff stream has run what was queued (the notice may come a little
  // after the stream is idle).
  const uint32_t copied = NewEvent();
  absl::StatusOr<uint64_t> third = absl::UnknownError("not tried");
  for (const absl::Time deadline = absl::Now() + kBound; absl::Now() < deadline;) {
    third = CopyOut(*c, copied);
    if (!absl::IsResourceExhausted(third.status())) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_THAT(third, IsOk());
  EXPECT_EQ(*third, *first);
  ASSERT_THAT(parts_->device().SynchronizeEvent(parts_->events().event(copied)), IsOk());
  EXPECT_EQ(FirstPatternMismatch(loaders_->buffer().data() + *third, kObjectBytes, 3), -1);
  EXPECT_EQ(FirstPatternMismatch(loaders_->buffer().data() + *second, kObjectBytes, 2), -1);
}

}  // namespace
}  // namespace tierd
