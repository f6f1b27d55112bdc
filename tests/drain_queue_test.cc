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
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kSlotBytes = 64 << 10;
constexpr absl::Duration kBound = absl::Seconds(10);
// How long a drain that must not complete is given to complete anyway.
constexpr absl::Duration kNotYet = absl::Milliseconds(100);

class DrainQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    auto catalog = Catalog::Open(absl::StrCat(dir_.path(), "/state"));
    ASSERT_THAT(catalog, IsOk());
    catalog_ = *std::move(catalog);
    auto pool = StagingPool::Create(*device_, 2 * kSlotBytes, kSlotBytes);
    ASSERT_THAT(pool, IsOk());
    pool_ = *std::move(pool);
    // One event at most: whether the drain's event is handed out again shows in Acquire.
    events_ = std::make_unique<EventPool>(*device_, /*max_events=*/1, /*batch=*/1);
    clients_ = std::make_unique<ClientTable>(mu_, *device_, /*max_clients=*/2);
    residency_ = std::make_unique<StagingResidency>(
        mu_, *device_, *catalog_, *pool_, *events_, stats_, liveness_,
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return drains_->pending(); });
    timer_ = std::make_unique<TimerThread>();
    drains_ = std::make_unique<DrainQueue>(mu_, *device_, *events_, *clients_, *residency_, *timer_,
                                           liveness_);
    auto client_stream = device_->CreateStream(StreamPriority::kNormal);
    ASSERT_THAT(client_stream, IsOk());
    client_stream_ = *std::move(client_stream);
    absl::StatusOr<ClientId> client = clients_->Open({}, {});
    ASSERT_THAT(client, IsOk());
    client_ = *client;
  }

  void TearDown() override {
    LetTheClientGo();
    if (client_stream_ != nullptr) {
      EXPECT_THAT(device_->SynchronizeStream(*client_stream_), IsOk());
    }
    // The timer's pending calls run before the rest goes; late completions find the queue gone.
    timer_.reset();
    liveness_->MarkGone();
    std::unique_ptr<GpuClient> client;
    {
      absl::MutexLock lock(&mu_);
      client = clients_->Erase(client_);
    }
    // Its drain stream goes after the lock, as the tier's do.
    client.reset();
  }

  // Holds the client's stream back until LetTheClientGo (or a bound), then records `event` on it:
  // the event's newest record completes only when the test lets it.
  void RecordHeldBack(uint32_t event) {
    ASSERT_THAT(device_->LaunchHostFunction(*client_stream_,
                                            [this] { go_.WaitForNotificationWithTimeout(kBound); }),
                IsOk());
    ASSERT_THAT(device_->RecordEvent(events_->event(event), *client_stream_), IsOk());
  }

  void LetTheClientGo() {
    if (!go_.HasBeenNotified()) go_.Notify();
  }

  // Starts a drain of `event` for the client, which owns the event (as the drain of a closed
  // session owns its done events); `forced` is set when it completes.
  uint64_t StartDrain(uint32_t event, std::optional<bool>& forced) {
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    GpuClient& client = *clients_->FindAny(client_);
    drains_->Start(
        client, {event}, {event},
        [&forced](bool was_forced, DrainQueue::Deferred&) { forced = was_forced; },
        deferred.calls());
    EXPECT_EQ(client.drains.size(), 1u);
    return *client.drains.begin();
  }

  // Waits (bounded) until `forced` is set; returns whether it was.
  bool AwaitDrained(const std::optional<bool>& forced, absl::Duration bound = kBound) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        absl::Condition(
            +[](const std::optional<bool>* forced) { return forced->has_value(); }, &forced),
        bound);
  }

  testing::TempDir dir_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<StagingPool> pool_;
  std::unique_ptr<EventPool> events_;
  absl::Mutex mu_;
  GpuTierStats stats_;
  std::shared_ptr<Liveness> liveness_ = std::make_shared<Liveness>();
  std::unique_ptr<ClientTable> clients_;
  std::unique_ptr<StagingResidency> residency_;
  std::unique_ptr<TimerThread> timer_;
  std::unique_ptr<DrainQueue> drains_;
  std::unique_ptr<Stream> client_stream_;
  absl::Notification go_;
  ClientId client_ = 0;
};

TEST_F(DrainQueueTest, CompletesOnlyOnceTheClientsEventHasCompleted) {
  absl::StatusOr<uint32_t> event = events_->Acquire(EventUse::kClientRecords);
  ASSERT_THAT(event, IsOk());
  RecordHeldBack(*event);
  std::optional<bool> forced;
  StartDrain(*event, forced);
  EXPECT_FALSE(AwaitDrained(forced, kNotYet));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(drains_->pending());
  }
  // Still held by the drain: not handed out.
  EXPECT_THAT(events_->Acquire(EventUse::kClientRecords), StatusIs(absl::StatusCode::kResourceExhausted));

  LetTheClientGo();
  ASSERT_TRUE(AwaitDrained(forced));
  EXPECT_FALSE(*forced);
  {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(drains_->pending());
    EXPECT_EQ(drains_->abandoned_waits(), 0u);
    EXPECT_TRUE(clients_->FindAny(client_)->drains.empty());
  }
  absl::StatusOr<uint32_t> again = events_->Acquire(EventUse::kClientRecords);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(*again, *event);
}

TEST_F(DrainQueueTest, CompletesAtOnceWhenTheEventHasCompletedAlready) {
  absl::StatusOr<uint32_t> event = events_->Acquire(EventUse::kClientRecords);
  ASSERT_THAT(event, IsOk());
  ASSERT_THAT(device_->RecordEvent(events_->event(*event), *client_stream_), IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*client_stream_), IsOk());
  std::optional<bool> forced;
  StartDrain(*event, forced);
  ASSERT_TRUE(AwaitDrained(forced));
  EXPECT_FALSE(*forced);
  EXPECT_THAT(events_->Acquire(EventUse::kClientRecords), IsOk());
}

TEST_F(DrainQueueTest, ADrainWithNothingToWaitForCompletesBeforeStartReturns) {
  absl::StatusOr<uint32_t> owned = events_->Acquire(EventUse::kClientRecords);
  ASSERT_THAT(owned, IsOk());
  std::optional<bool> forced;
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    GpuClient& client = *clients_->FindAny(client_);
    // A release that names no done event: nothing of the client reads the buffer any more.
    drains_->Start(
        client, {}, {*owned},
        [&forced](bool was_forced, DrainQueue::Deferred&) { forced = was_forced; },
        deferred.calls());
    ASSERT_TRUE(forced.has_value());
    EXPECT_FALSE(*forced);
    EXPECT_FALSE(drains_->pending());
    EXPECT_TRUE(client.drains.empty());
  }
  EXPECT_THAT(events_->Acquire(EventUse::kClientRecords), IsOk());  // the owned event went back to the pool
}

TEST_F(DrainQueueTest, AForcedDrainRetiresItsEventAndCountsAnAbandonedWait) {
  absl::StatusOr<uint32_t> event = events_->Acquire(EventUse::kClientRecords);
  ASSERT_THAT(event, IsOk());
  RecordHeldBack(*event);
  std::optional<bool> forced;
  const uint64_t drain = StartDrain(*event, forced);
  EXPECT_FALSE(AwaitDrained(forced, kNotYet));
  {
    // The client's close grace ran out: the tier forces its drains, as GpuTier::ForceClose does.
    DeferredCalls deferred;
    absl::MutexLock lock(&mu_);
    GpuClient& client = *clients_->FindAny(client_);
    client.closed = true;
    drains_->Finish(drain, /*forced=*/true, deferred.calls());
    ASSERT_TRUE(forced.has_value());
    EXPECT_TRUE(*forced);
    EXPECT_FALSE(drains_->pending());
    EXPECT_EQ(drains_->abandoned_waits(), 1u);
    EXPECT_TRUE(client.drains.empty());
  }
  // The event may still have a record that never completes: it is not handed out again.
  EXPECT_THAT(events_->Acquire(EventUse::kClientRecords), StatusIs(absl::StatusCode::kResourceExhausted));

  // When the event does complete later, the drain is gone already: nothing runs twice.
  forced.reset();
  LetTheClientGo();
  ASSERT_THAT(device_->SynchronizeStream(*client_stream_), IsOk());
  EXPECT_FALSE(AwaitDrained(forced, kNotYet));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(drains_->abandoned_waits(), 1u);
  EXPECT_FALSE(drains_->pending());
}

TEST_F(DrainQueueTest, ACompletedDrainServesARequestWaitingForStagingRoom) {
  absl::StatusOr<uint32_t> event = events_->Acquire(EventUse::kClientRecords);
  ASSERT_THAT(event, IsOk());
  // The pool is full, with nothing listed to evict.
  std::optional<StagingAllocation> first = pool_->Allocate(kSlotBytes);
  std::optional<StagingAllocation> second = pool_->Allocate(kSlotBytes);
  ASSERT_TRUE(first.has_value() && second.has_value());
  RecordHeldBack(*event);
  std::optional<bool> forced;
  {
    absl::MutexLock lock(&mu_);
    GpuClient& client = *clients_->FindAny(client_);
    // The drain frees a range when it completes, as a released lease's drain does.
    DeferredCalls deferred;
    drains_->Start(
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
    absl::MutexLock lock(&mu_);
    // A drain is pending, so the request waits rather than being refused.
    residency_->Allocate(
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
