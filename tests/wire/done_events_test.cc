// DoneEvents (wire/done_events.h): which of a session's done events a release records, on the host
// backend, with streams held back so that records stay pending.
#include "wire/done_events.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "device/host_device.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;

constexpr absl::Duration kBound = absl::Seconds(10);
constexpr absl::Duration kNotYet = absl::Milliseconds(100);

class DoneEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    for (int i = 0; i < 3; ++i) {
      auto stream = device_->CreateStream(StreamPriority::kNormal);
      ASSERT_THAT(stream, IsOk());
      streams_.push_back(*std::move(stream));
    }
  }

  void TearDown() override {
    for (absl::Notification& go : go_) {
      if (!go.HasBeenNotified()) go.Notify();
    }
    for (auto& stream : streams_) EXPECT_THAT(device_->SynchronizeStream(*stream), IsOk());
  }

  // `count` events, opened as a client opens the ones its session is given (ids 10, 11, ...).
  std::unique_ptr<DoneEvents> MakeDoneEvents(int count) {
    std::vector<DoneEvents::Opened> opened;
    for (int i = 0; i < count; ++i) {
      auto event = device_->CreateEvent();
      EXPECT_THAT(event, IsOk());
      events_.push_back(*std::move(event));
      opened.push_back({static_cast<uint32_t>(10 + i), events_.back().get()});
    }
    return std::make_unique<DoneEvents>(*device_, std::move(opened));
  }

  // RecordAfter for a release of lease `id`, which must not fail.
  static std::optional<uint32_t> Record(DoneEvents& done, Stream& stream, uint64_t id) {
    absl::StatusOr<std::optional<uint32_t>> recorded = done.RecordAfter(stream, "lease", id);
    EXPECT_THAT(recorded, IsOk());
    return recorded.ok() ? *recorded : std::nullopt;
  }

  // Holds stream `i` back until Go(i): what is recorded on it after this stays pending.
  void HoldBack(int i) {
    ASSERT_THAT(device_->LaunchHostFunction(
                    *streams_[i], [this, i] { go_[i].WaitForNotificationWithTimeout(kBound); }),
                IsOk());
  }
  void Go(int i) { go_[i].Notify(); }

  std::unique_ptr<Device> device_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<std::unique_ptr<Event>> events_;
  absl::Notification go_[3];
};

TEST_F(DoneEventsTest, AStreamKeepsItsEventHoweverManyRecordsArePending) {
  auto done = MakeDoneEvents(2);
  HoldBack(0);
  const std::optional<uint32_t> first = Record(*done, *streams_[0], 1);
  ASSERT_TRUE(first.has_value());
  // Pending on the same stream: recording it again there is covered by stream order.
  EXPECT_EQ(Record(*done, *streams_[0], 2), first);
  EXPECT_EQ(Record(*done, *streams_[0], 3), first);
}

TEST_F(DoneEventsTest, AStreamWithNothingPendingNeedsNoEvent) {
  auto done = MakeDoneEvents(2);
  EXPECT_EQ(Record(*done, *streams_[0], 1), std::nullopt);
  HoldBack(0);
  EXPECT_TRUE(Record(*done, *streams_[0], 2).has_value());
}

TEST_F(DoneEventsTest, AnotherStreamTakesAnEventThatIsNotPendingElsewhere) {
  auto done = MakeDoneEvents(2);
  HoldBack(0);
  HoldBack(1);
  const std::optional<uint32_t> on_first = Record(*done, *streams_[0], 1);
  const std::optional<uint32_t> on_second = Record(*done, *streams_[1], 2);
  ASSERT_TRUE(on_first.has_value() && on_second.has_value());
  EXPECT_NE(*on_first, *on_second);
  // Once the first stream's record has completed, its event may serve a third stream.
  Go(0);
  ASSERT_THAT(device_->SynchronizeStream(*streams_[0]), IsOk());
  EXPECT_EQ(Record(*done, *streams_[1], 3), on_second);
  HoldBack(2);
  EXPECT_EQ(Record(*done, *streams_[2], 4), on_first);
}

TEST_F(DoneEventsTest, WithEveryEventPendingOnOtherStreamsTheOldestIsWaitedFor) {
  auto done = MakeDoneEvents(2);
  HoldBack(0);
  HoldBack(1);
  HoldBack(2);
  const std::optional<uint32_t> oldest = Record(*done, *streams_[0], 1);
  ASSERT_TRUE(Record(*done, *streams_[1], 2).has_value());
  std::optional<uint32_t> third;
  absl::Notification recorded;
  std::thread releaser([&] {
    third = Record(*done, *streams_[2], 3);
    recorded.Notify();
  });
  // Neither event may be recorded on a third stream while its record is pending there.
  EXPECT_FALSE(recorded.WaitForNotificationWithTimeout(kNotYet));
  Go(0);
  EXPECT_TRUE(recorded.WaitForNotificationWithTimeout(kBound));
  Go(2);
  releaser.join();
  EXPECT_EQ(third, oldest);
}

TEST_F(DoneEventsTest, WithoutEventsTheStreamIsWaitedForAndNoneIsNamed) {
  auto done = MakeDoneEvents(0);
  HoldBack(0);
  std::optional<uint32_t> named = 7;
  absl::Notification returned;
  std::thread releaser([&] {
    named = Record(*done, *streams_[0], 1);
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kNotYet));
  Go(0);
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kBound));
  releaser.join();
  EXPECT_FALSE(named.has_value());
}

}  // namespace
}  // namespace tierd
