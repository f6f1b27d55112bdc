// LogLine: the first lines of a process, logged by two threads at once, both arrive whole.
//
// Under TSan this is the test of tests/tsan/suppressions.txt's entry for libabsl_time_zone: the
// first line loads the local time zone behind a static that uninstrumented code reads, so a
// second thread's first line looked raced with it (daemon_health_test failed on that once).
// This must stay the only test in its binary: it needs the process's first log lines.
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "gtest/gtest.h"

namespace tierd {
namespace {

TEST(LogLineTest, TwoThreadsFirstLinesBothArriveWhole) {
  testing::internal::CaptureStderr();
  // No synchronization TSan can see between the two first lines: the other thread only sleeps,
  // as a gRPC thread of a daemon starting up does.
  std::thread other([] {
    absl::SleepFor(absl::Milliseconds(50));
    TIERD_LOG(INFO) << "from the other thread";
  });
  TIERD_LOG(WARNING) << "from the main thread";
  other.join();
  const std::string logged = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(logged, "from the main thread\n")) << logged;
  EXPECT_TRUE(absl::StrContains(logged, "from the other thread\n")) << logged;
  EXPECT_TRUE(absl::StartsWith(logged, "W")) << logged;
  EXPECT_TRUE(absl::StrContains(logged, "\nI")) << logged;
}

}  // namespace
}  // namespace tierd
