// The owner side of the Device contract, run against each backend (host in CI; CUDA on a GPU).
#include "device/device.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "device/pinned_host_buffer.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::FillPattern;
using ::tierd::testing::FirstPatternMismatch;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::StatusIs;

// An odd size, so no copy path can get away with whole words or pages.
constexpr size_t kBytes = (5 << 20) + 13;
constexpr absl::Duration kStall = absl::Milliseconds(300);

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = CreateDevice(testing::DeviceUnderTest());
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    stream_ = NewStream(StreamPriority::kNormal);
  }

  std::unique_ptr<Stream> NewStream(StreamPriority priority) {
    auto stream = device_->CreateStream(priority);
    EXPECT_THAT(stream, IsOk());
    return stream.ok() ? *std::move(stream) : nullptr;
  }

  std::unique_ptr<PinnedHostBuffer> NewPinned(size_t bytes, uint64_t seed) {
    auto buffer = PinnedHostBuffer::Create(*device_, bytes);
    EXPECT_THAT(buffer, IsOk());
    if (!buffer.ok()) return nullptr;
    FillPattern((*buffer)->data(), bytes, seed);
    return *std::move(buffer);
  }

  std::unique_ptr<Slab> NewZeroedSlab(size_t bytes) {
    auto slab = device_->AllocateSlab(bytes);
    EXPECT_THAT(slab, IsOk());
    if (!slab.ok()) return nullptr;
    auto zeros = PinnedHostBuffer::Create(*device_, bytes);
    EXPECT_THAT(zeros, IsOk());
    std::memset((*zeros)->data(), 0, bytes);
    EXPECT_THAT(device_->CopyAsync(*stream_, (*slab)->data(), (*zeros)->data(), bytes), IsOk());
    EXPECT_THAT(device_->SynchronizeStream(*stream_), IsOk());
    return *std::move(slab);
  }

  void Stall(Stream& stream, absl::Duration how_long) {
    ASSERT_THAT(device_->LaunchHostFunction(stream, [how_long] { absl::SleepFor(how_long); }),
                IsOk());
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(DeviceTest, SaysWhichBackendAndGpuItIs) {
  const DeviceSpec spec = testing::DeviceUnderTest();
  if (spec.kind == DeviceSpec::Kind::kCuda) {
    EXPECT_STREQ(device_->backend(), "cuda");
    EXPECT_EQ(device_->ordinal(), spec.ordinal);
  } else {
    EXPECT_STREQ(device_->backend(), "host");
    EXPECT_EQ(device_->ordinal(), 0);
  }
}

TEST_F(DeviceTest, CopiesHostToDeviceToDeviceToHostPreserveEveryByte) {
  auto source = NewPinned(kBytes, 1);
  auto result = NewPinned(kBytes, 2);
  auto first = NewZeroedSlab(kBytes);
  auto second = NewZeroedSlab(kBytes);
  ASSERT_THAT(device_->CopyAsync(*stream_, first->data(), source->data(), kBytes), IsOk());
  ASSERT_THAT(device_->CopyAsync(*stream_, second->data(), first->data(), kBytes), IsOk());
  ASSERT_THAT(device_->CopyAsync(*stream_, result->data(), second->data(), kBytes), IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  EXPECT_EQ(FirstPatternMismatch(result->data(), kBytes, 1), -1);
}

TEST_F(DeviceTest, TwoDimensionalCopiesTakeEachRowFromItsPitch) {
  // Columns [300, 300 + 1001) of 3001 rows of 4099 bytes, host → device packed, then back out
  // into every other 1001 bytes of the result.
  constexpr size_t kPitch = 4099, kRows = 3001, kWidth = 1001, kFirst = 300;
  auto source = NewPinned(kPitch * kRows, 6);
  auto result = NewPinned(2 * kWidth * kRows, 7);
  auto slab = NewZeroedSlab(kWidth * kRows);
  const auto* from = static_cast<const uint8_t*>(source->data());
  const auto* out = static_cast<const uint8_t*>(result->data());
  ASSERT_THAT(
      device_->CopyAsync2D(*stream_, slab->data(), kWidth, from + kFirst, kPitch, kWidth, kRows),
      IsOk());
  ASSERT_THAT(device_->CopyAsync2D(*stream_, result->data(), 2 * kWidth, slab->data(), kWidth,
                                   kWidth, kRows),
              IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  std::vector<uint8_t> untouched(2 * kWidth * kRows);
  FillPattern(untouched.data(), untouched.size(), 7);
  for (size_t row = 0; row < kRows; ++row) {
    ASSERT_EQ(std::memcmp(out + row * 2 * kWidth, from + row * kPitch + kFirst, kWidth), 0)
        << "row " << row;
    ASSERT_EQ(std::memcmp(out + row * 2 * kWidth + kWidth,
                          untouched.data() + row * 2 * kWidth + kWidth, kWidth),
              0)
        << "the gap after row " << row << " was written";
  }
  // One row is a plain copy, whatever the pitches say; a pitch narrower than a row is refused.
  ASSERT_THAT(device_->CopyAsync2D(*stream_, slab->data(), 0, source->data(), 0, kWidth, 1),
              IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  EXPECT_THAT(
      device_->CopyAsync2D(*stream_, slab->data(), kWidth, source->data(), kWidth - 1, kWidth, 2),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(device_->CopyAsync2D(*stream_, nullptr, kWidth, source->data(), kWidth, kWidth, 2),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(DeviceTest, EventCompletesOnlyAfterEarlierWorkOnItsStream) {
  auto source = NewPinned(kBytes, 3);
  auto result = NewPinned(kBytes, 4);
  auto slab = NewZeroedSlab(kBytes);
  auto event = device_->CreateEvent();
  ASSERT_THAT(event, IsOk());
  Stall(*stream_, kStall);
  ASSERT_THAT(device_->CopyAsync(*stream_, slab->data(), source->data(), kBytes), IsOk());
  ASSERT_THAT(device_->CopyAsync(*stream_, result->data(), slab->data(), kBytes), IsOk());
  ASSERT_THAT(device_->RecordEvent(**event, *stream_), IsOk());
  // The stall is still running, so the event cannot have completed.
  EXPECT_THAT(device_->QueryEvent(**event), IsOkAndHolds(false));
  ASSERT_THAT(device_->SynchronizeEvent(**event), IsOk());
  EXPECT_THAT(device_->QueryEvent(**event), IsOkAndHolds(true));
  EXPECT_EQ(FirstPatternMismatch(result->data(), kBytes, 3), -1);
}

TEST_F(DeviceTest, StreamWaitsForEventRecordedOnAnotherStream) {
  auto source = NewPinned(kBytes, 5);
  auto result = NewPinned(kBytes, 6);
  auto slab = NewZeroedSlab(kBytes);
  auto producer = NewStream(StreamPriority::kNormal);
  auto consumer = NewStream(StreamPriority::kHigh);
  auto written = device_->CreateEvent();
  ASSERT_THAT(written, IsOk());
  Stall(*producer, kStall);
  ASSERT_THAT(device_->CopyAsync(*producer, slab->data(), source->data(), kBytes), IsOk());
  ASSERT_THAT(device_->RecordEvent(**written, *producer), IsOk());
  ASSERT_THAT(device_->WaitEvent(*consumer, **written), IsOk());
  ASSERT_THAT(device_->CopyAsync(*consumer, result->data(), slab->data(), kBytes), IsOk());
  ASSERT_THAT(device_->SynchronizeStream(*consumer), IsOk());
  // Without the wait the consumer would have read the zeroed slab during the producer's stall.
  EXPECT_EQ(FirstPatternMismatch(result->data(), kBytes, 5), -1);
}

TEST_F(DeviceTest, NeverRecordedEventIsComplete) {
  auto event = device_->CreateEvent();
  ASSERT_THAT(event, IsOk());
  EXPECT_THAT(device_->QueryEvent(**event), IsOkAndHolds(true));
  EXPECT_THAT(device_->SynchronizeEvent(**event), IsOk());
  ASSERT_THAT(device_->WaitEvent(*stream_, **event), IsOk());
  EXPECT_THAT(device_->SynchronizeStream(*stream_), IsOk());
}

TEST_F(DeviceTest, TimeMarksMeasureTheWorkBetweenThemOnceReached) {
  auto start = device_->CreateTimeMark();
  auto end = device_->CreateTimeMark();
  ASSERT_THAT(start, IsOk());
  ASSERT_THAT(end, IsOk());
  EXPECT_THAT(device_->TimeBetween(**start, **end),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  for (int round = 0; round < 2; ++round) {  // a mark recorded again measures its new record
    ASSERT_THAT(device_->RecordTimeMark(**start, *stream_), IsOk());
    Stall(*stream_, kStall);
    ASSERT_THAT(device_->RecordTimeMark(**end, *stream_), IsOk());
    // The stall is still running: the end has not been reached.
    EXPECT_THAT(device_->TimeBetween(**start, **end),
                StatusIs(absl::StatusCode::kFailedPrecondition));
    ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
    absl::StatusOr<absl::Duration> took = device_->TimeBetween(**start, **end);
    ASSERT_THAT(took, IsOk());
    EXPECT_GE(*took, kStall * 0.9);
    EXPECT_LT(*took, absl::Seconds(30));
  }
}

TEST_F(DeviceTest, NotifyWhenDoneRunsAfterEarlierWorkWithoutHoldingUpLaterWork) {
  auto source = NewPinned(kBytes, 7);
  auto result = NewPinned(kBytes, 8);
  auto slab = NewZeroedSlab(kBytes);
  Stall(*stream_, kStall);
  ASSERT_THAT(device_->CopyAsync(*stream_, slab->data(), source->data(), kBytes), IsOk());
  ASSERT_THAT(device_->CopyAsync(*stream_, result->data(), slab->data(), kBytes), IsOk());

  // Shared with the callback, which may still be returning when the test body ends.
  struct Observations {
    absl::Notification callback_ran;
    absl::Notification later_work_done;
    std::atomic<int64_t> mismatch{-2};
    std::atomic<bool> query_ok{false};
  };
  auto seen = std::make_shared<Observations>();
  auto marker = device_->CreateEvent();
  ASSERT_THAT(marker, IsOk());
  Event* marker_event = marker->get();
  Device* device = device_.get();
  void* result_data = result->data();
  ASSERT_THAT(device_->NotifyWhenDone(
                  *stream_,
                  [seen, device, marker_event, result_data] {
                    seen->mismatch = FirstPatternMismatch(result_data, kBytes, 7);
                    // Callbacks may call into the device.
                    seen->query_ok = device->QueryEvent(*marker_event).ok();
                    // Everything but `seen` is left alone from here on, so the test may end.
                    seen->callback_ran.Notify();
                    // Block until the work enqueued after us has finished: if callbacks held up the
                    // stream, this would never happen.
                    seen->later_work_done.WaitForNotificationWithTimeout(absl::Seconds(30));
                  }),
              IsOk());
  ASSERT_THAT(device_->RecordEvent(**marker, *stream_), IsOk());
  ASSERT_THAT(device_->SynchronizeEvent(**marker), IsOk());
  seen->later_work_done.Notify();
  ASSERT_TRUE(seen->callback_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(seen->mismatch.load(), -1);
  EXPECT_TRUE(seen->query_ok.load());
}

TEST_F(DeviceTest, HostFunctionsRunInStreamOrder) {
  std::vector<int> order;
  absl::Mutex mu;
  for (int i = 0; i < 20; ++i) {
    ASSERT_THAT(device_->LaunchHostFunction(*stream_,
                                            [&, i] {
                                              absl::MutexLock lock(&mu);
                                              order.push_back(i);
                                            }),
                IsOk());
  }
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[i], i);
}

TEST_F(DeviceTest, ManyEventsCanBeLiveAtOnce) {
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < 3000; ++i) {
    auto event = device_->CreateEvent();
    ASSERT_THAT(event, IsOk());
    ASSERT_THAT(device_->RecordEvent(**event, *stream_), IsOk());
    events.push_back(*std::move(event));
  }
  ASSERT_THAT(device_->SynchronizeStream(*stream_), IsOk());
  for (auto& event : events) EXPECT_THAT(device_->QueryEvent(*event), IsOkAndHolds(true));
}

TEST_F(DeviceTest, PinnedHostBufferIsPageAlignedAndRegistered) {
  auto buffer = PinnedHostBuffer::Create(*device_, 10000);
  ASSERT_THAT(buffer, IsOk());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*buffer)->data()) % PageSize(), 0u);
  EXPECT_EQ((*buffer)->size() % PageSize(), 0u);
  EXPECT_GE((*buffer)->size(), 10000u);
  // Registering the same range again is a state error, not a crash.
  EXPECT_THAT(device_->RegisterHostMemory((*buffer)->data(), (*buffer)->size()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(DeviceTest, BadArgumentsAreErrorsNotCrashes) {
  EXPECT_THAT(device_->AllocateSlab(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(device_->RegisterHostMemory(nullptr, 4096),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PinnedHostBuffer::Create(*device_, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  int not_registered = 0;
  EXPECT_THAT(device_->UnregisterHostMemory(&not_registered),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(DeviceTest, OpeningGarbageHandlesIsInvalidArgument) {
  auto slab = device_->AllocateSlab(4096);
  ASSERT_THAT(slab, IsOk());
  auto event = device_->CreateEvent();
  ASSERT_THAT(event, IsOk());
  for (const std::string& garbage :
       {std::string(), std::string("nonsense"), std::string(200, '\xff'),
        std::string("tierd-host-slab:/etc/passwd"), std::string("tierd-host-event:/x:1"),
        std::string("tierd-cuda-slab:short"), std::string("tierd-cuda-event:short")}) {
    EXPECT_THAT(device_->OpenSlab(garbage), StatusIs(absl::StatusCode::kInvalidArgument))
        << garbage;
    EXPECT_THAT(device_->OpenEvent(garbage), StatusIs(absl::StatusCode::kInvalidArgument))
        << garbage;
  }
  // A handle of the other kind is refused too.
  EXPECT_THAT(device_->OpenEvent((*slab)->handle()), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(device_->OpenSlab((*event)->handle()), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tierd
