// DrainQueue on its own: a drain completes only once its client's event has completed on the
// client's drain stream, hands the event out again then, and when forced by the client's close
// grace retires the event and counts the abandoned wait instead.
#include "gpu/detail/drain_queue.h"

#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "device/host_device.h"
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
constexpr absl::Duration kBound = absl::Seconds(10);
// How long a drain that must not complete is given to complete anyway.
constexpr absl::Duration kNotYet = absl::Milliseconds(100);

class DrainQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GpuPartsOptions options;
    options.pool_bytes = 2 * kSlotBytes;
    options.slab_bytes = kSlotBytes;
    // One event at most: whether the drain's event is handed out again shows in Acquire.
    options.max_events = 1;
    options.event_batch = 1;
    auto parts = GpuParts::Create(options);
    ASSERT_THAT(parts, IsOk());
    parts_ = *std::move(parts);
    client_stream_ = parts_->NewStream();
    ASSERT_NE(client_stream_, nullptr);
    absl::StatusOr<ClientId> client = parts_->OpenClient();
    ASSERT_THAT(client, IsOk());
    client_ = *client;
  }

  void TearDown() override {
    LetTheClientGo();
    // The parts go as the tier's do: the timer's pending calls run first, late completions find
    // the queue gone, the client's drain stream goes after the lock.
    parts_.reset();
  }

  // Holds the client's stream back until LetTheClientGo (or a bound), then records `event` on it:
  // the event's newest record completes only when the test lets it.
  void RecordHeldBack(uint32_t event) {
    ASSERT_THAT(parts_->device().LaunchHostFunction(*client_stream_,
                                            [this] { go_.WaitForNotificationWithTimeout(kBound); }),
                IsOk());
    ASSERT_THAT(parts_->device().RecordEvent(parts_->events().event(event), *client_stream_), IsOk());
  }

  void LetTheClientGo() {
    if (!go_.HasBeenNotified()) go_.Notify();
  }

  // Starts a drain of `event` for the client, which owns the event (as the drain of a closed
  // session owns its done events); `forced` is set when it completes.
  uint64_t StartDrain(uint32_t event, std::optional<bool>& forced) {
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_->mu);
    GpuClient& client = *parts_->clients().FindAny(client_);
    parts_->drains().Start(
        client, {event}, {event},
        [&forced](bool was_forced, DrainQueue::Deferred&) { forced = was_forced; },
        deferred.calls());
    EXPECT_EQ(client.drains.size(), 1u);
    return *client.drains.begin();
  }

  // Waits (bounded) until `forced` is set; returns whether it was.
  bool AwaitDrained(const std::optional<bool>& forced, absl::Duration bound = kBound) {
    absl::MutexLock lock(&parts_->mu);
    return parts_->mu.AwaitWithTimeout(
        absl::Condition(
            +[](const std::optional<bool>* forced) { return forced->has_value(); }, &forced),
        bound);
  }

  std::unique_ptr<GpuParts> parts_;
  Stream* client_stream_ = nullptr;
  absl::Notification go_;
  ClientId client_ = 0;
};

TEST_F(DrainQueueTest, CompletesOnlyOnceTheClientsEventHasCompleted) {
  absl::StatusOr<uint32_t> event = parts_->events().Acquire(EventUse::kClientRecords);
  ASSERT_THAT(event, IsOk());
  RecordHeldBack(*event);
  std::optional<bool> forced;
  StartDrain(*event, forced);
  EXPECT_FALSE(AwaitDrained(forced, kNotYet));
  {
    absl::MutexLock lock(&parts_->mu);
    EXPECT_TRUE(parts_->drains().pending());
  }
  // Still held by the drain: not handed out.
  EXPECT_THAT(parts_->events().Acquire(EventUse::kClientRecords), StatusIs(absl::StatusCode::kResourceExhausted));

  LetTheClientGo();
  ASSERT_TRUE(AwaitDrained(forced));
  EXPECT_FALSE(*forced);
  {
    absl::MutexLock lock(&parts_->mu);
    EXPECT_FALSE(parts_->drains().pending());
    EXPECT_EQ(parts_->drains().abandoned_waits(), 0u);
    EXPECT_TRUE(parts_->clients().FindAny(client_)->drains.empty());
  }
  absl::StatusOr<uint32_t> again = parts_->events().Acquire(EventUse::kClientRecords);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(*again, *event);
}

TEST_F(DrainQueueTest, CompletesAtOnceWhenTheEventHasCompletedAlready) {
  absl::StatusOr<uint32_t> event = parts_->events().Acquire(EventUse::kClientRecords);
  ASSERT_THAT(event, IsOk());
  ASSERT_THAT(parts_->device().RecordEvent(parts_->events().event(*event), *client_stream_), IsOk());
  ASSERT_THAT(parts_->device().SynchronizeStream(*client_stream_), IsOk());
  std::optional<bool> forced;
  StartDrain(*event, forced);
  ASSERT_TRUE(AwaitDrained(forced));
  EXPECT_FALSE(*forced);
  EXPECT_THAT(parts_->events().Acquire(EventUse::kClientRecords), IsOk());
}

TEST_F(DrainQueueTest, ADrainWithNothingToWaitForCompletesBeforeStartReturns) {
  absl::StatusOr<uint32_t> owned = parts_->events().Acquire(EventUse::kClientRecords);
  ASSERT_THAT(owned, IsOk());
  std::optional<bool> forced;
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_->mu);
    GpuClient& client = *parts_->clients().FindAny(client_);
    // A release that names no done event: nothing of the client reads the buffer any more.
    parts_->drains().Start(
        client, {}, {*owned},
        [&forced](bool was_forced, DrainQueue::Deferred&) { forced = was_forced; },
        deferred.calls());
    ASSERT_TRUE(forced.has_value());
    EXPECT_FALSE(*forced);
    EXPECT_FALSE(parts_->drains().pending());
    EXPECT_TRUE(client.drains.empty());
  }
  EXPECT_THAT(parts_->events().Acquire(EventUse::kClientRecords), IsOk());  // the owned event went back to the pool
}

TEST_F(DrainQueueTest, AForcedDrainRetiresItsEventAndCountsAnAbandonedWait) {
  absl::StatusOr<uint32_t> event = parts_->events().Acquire(EventUse::kClientRecords);
  ASSERT_THAT(event, IsOk());
  RecordHeldBack(*event);
  std::optional<bool> forced;
  const uint64_t drain = StartDrain(*event, forced);
  EXPECT_FALSE(AwaitDrained(forced, kNotYet));
  {
    // The client's close grace ran out: the tier forces its drains, as GpuTier::ForceClose does.
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_->mu);
    GpuClient& client = *parts_->clients().FindAny(client_);
    client.closed = true;
    parts_->drains().Finish(drain, /*forced=*/true, deferred.calls());
    ASSERT_TRUE(forced.has_value());
    EXPECT_TRUE(*forced);
    EXPECT_FALSE(parts_->drains().pending());
    EXPECT_EQ(parts_->drains().abandoned_waits(), 1u);
    EXPECT_TRUE(client.drains.empty());
  }
  // The event may still have a record that never completes: it is not handed out again.
  EXPECT_THAT(parts_->events().Acquire(EventUse::kClientRecords), StatusIs(absl::StatusCode::kResourceExhausted));

  // When the event does complete later, the drain is gone already: nothing runs twice.
  forced.reset();
  LetTheClientGo();
  ASSERT_THAT(parts_->device().SynchronizeStream(*client_stream_), IsOk());
  EXPECT_FALSE(AwaitDrained(forced, kNotYet));
  absl::MutexLock lock(&parts_->mu);
  EXPECT_EQ(parts_->drains().abandoned_waits(), 1u);
  EXPECT_FALSE(parts_->drains().pending());
}

TEST_F(DrainQueueTest, ACompletedDrainServesARequestWaitingForStagingRoom) {
  absl::StatusOr<uint32_t> event = parts_->events().Acquire(EventUse::kClientRecords);
  ASSERT_THAT(event, IsOk());
  // The pool is full, with nothing listed to evict.
  std::optional<StagingAllocation> first = parts_->pool().Allocate(kSlotBytes);
  std::optional<StagingAllocation> second = parts_->pool().Allocate(kSlotBytes);
  ASSERT_TRUE(first.has_value() && second.has_value());
  RecordHeldBack(*event);
  std::optional<bool> forced;
  {
    absl::MutexLock lock(&parts_->mu);
    GpuClient& client = *parts_->clients().FindAny(client_);
    // The drain frees a range when it completes, as a released lease's drain does.
    DeferredCalls deferred;
    parts_->drains().Start(
        client, {*event}, {*event},
        [&forced, &first](bool was_forced, DrainQueue::Deferred&) {
          first.reset();
          forced = was_forced;
        },
        deferred.calls());
  }
  absl::StatusOr<StagingAllocation> answer = absl::UnknownError("not answered");
  absl::Notification answered;
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_->mu);
    // A drain is pending, so the request waits rather than being refused.
    parts_->residency().Allocate(
        kSlotBytes,
        [&answer, &answered](absl::StatusOr<StagingAllocation> memory) {
          answer = std::move(memory);
          answered.Notify();
        },
        deferred.calls());
  }
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(kNotYet));
  LetTheClientGo();
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(kBound));
  EXPECT_THAT(answer, IsOk());
  ASSERT_TRUE(AwaitDrained(forced));
  EXPECT_FALSE(*forced);
}

}  // namespace
}  // namespace tierd
