// Two separate processes exchange bytes through the Device layer: this test (the owner) and
// cross_process_peer, started with exec. Each side orders its access only through the shared
// event, and each write is preceded by a deliberate stall, so a missing or broken wait reads the
// old bytes and fails the check.
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "device/device.h"
#include "device/pinned_host_buffer.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::FillPattern;
using ::tierd::testing::FirstPatternMismatch;
using ::tierd::testing::IsOk;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::Subprocess;

constexpr size_t kBytes = (16 << 20) + 4093;
constexpr uint64_t kSeed = 42;
constexpr absl::Duration kTimeout = absl::Seconds(60);

TEST(CrossProcessSlabEventTest, PeerProcessReadsOwnerWritesAndOwnerReadsPeerWrites) {
  auto device = CreateDevice(testing::DeviceUnderTest());
  ASSERT_THAT(device, IsOk());
  Device& dev = **device;
  auto stream = dev.CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stream, IsOk());
  auto slab = dev.AllocateSlab(kBytes);
  ASSERT_THAT(slab, IsOk());
  auto event = dev.CreateEvent();
  ASSERT_THAT(event, IsOk());
  auto buffer = PinnedHostBuffer::Create(dev, kBytes);
  ASSERT_THAT(buffer, IsOk());

  // Zero the slab, then queue: stall, write the pattern, record the event.
  std::memset((*buffer)->data(), 0, kBytes);
  ASSERT_THAT(dev.CopyAsync(**stream, (*slab)->data(), (*buffer)->data(), kBytes), IsOk());
  ASSERT_THAT(dev.SynchronizeStream(**stream), IsOk());
  FillPattern((*buffer)->data(), kBytes, kSeed);
  ASSERT_THAT(dev.LaunchHostFunction(**stream, [] { absl::SleepFor(absl::Milliseconds(500)); }),
              IsOk());
  ASSERT_THAT(dev.CopyAsync(**stream, (*slab)->data(), (*buffer)->data(), kBytes), IsOk());
  ASSERT_THAT(dev.RecordEvent(**event, **stream), IsOk());

  auto peer = Subprocess::Start(
      {SiblingBinary("cross_process_peer"), testing::DeviceUnderTest().ToString(),
       absl::BytesToHexString((*slab)->handle()), absl::BytesToHexString((*event)->handle()),
       absl::StrCat(kBytes), absl::StrCat(kSeed)});
  ASSERT_THAT(peer, IsOk());
  EXPECT_THAT((*peer)->ReadLine(kTimeout),
              testing::IsOkAndHolds(absl::StrCat("verified ", kBytes)));
  ASSERT_THAT((*peer)->ReadLine(kTimeout), testing::IsOkAndHolds(std::string("recorded")));

  // The peer's write is still behind its stall; only the event makes us see it.
  std::memset((*buffer)->data(), 0, kBytes);
  ASSERT_THAT(dev.WaitEvent(**stream, **event), IsOk());
  ASSERT_THAT(dev.CopyAsync(**stream, (*buffer)->data(), (*slab)->data(), kBytes), IsOk());
  ASSERT_THAT(dev.SynchronizeStream(**stream), IsOk());
  EXPECT_EQ(FirstPatternMismatch((*buffer)->data(), kBytes, kSeed + 1), -1);

  (*peer)->CloseStdin();
  EXPECT_THAT((*peer)->Wait(kTimeout), testing::IsOkAndHolds(0));
}

}  // namespace
}  // namespace tierd
