// load_bench as a program against a daemon on the host backend: every call of a counted mix is
// reported, none fails, and a daemon that stops answering costs the run its deadlines, not a hang.
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/safetensors_writer.h"
#include "tests/daemon_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;

constexpr absl::Duration kTimeout = absl::Seconds(120);

class LoadBenchProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<TensorToWrite> tensors;
    for (int i = 0; i < 4; ++i) {
      tensors.push_back(
          {absl::StrCat("t", i), "U8", {64 << 10}, testing::PatternBytes(64 << 10, i)});
    }
    ASSERT_THAT(WriteSafetensors(model_dir() + "/model.safetensors", tensors), IsOk());
    auto daemon = testing::StartServingDaemon(
        {testing::SiblingBinary("tierd"), "--device=host", absl::StrCat("--socket=", socket()),
         absl::StrCat("--state-dir=", dir_.path(), "/state"), "--gpu-pool-bytes=16MiB",
         "--host-cache-bytes=32MiB"},
        socket(), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
  }

  std::string socket() const { return dir_.path() + "/tierd.sock"; }
  std::string model_dir() const { return dir_.path(); }
  std::string json() const { return dir_.path() + "/load.json"; }

  std::vector<std::string> LoadBench(const std::vector<std::string>& flags) const {
    std::vector<std::string> argv = {testing::SiblingBinary("load_bench"),
                                     absl::StrCat("--socket=", socket()),
                                     "--model=m",
                                     absl::StrCat("--model-dir=", model_dir()),
                                     absl::StrCat("--daemon-pid=", daemon_->pid()),
                                     absl::StrCat("--json=", json()),
                                     "--store-bytes=64KiB",
                                     "--warmup=3"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return argv;
  }

  nlohmann::json Result() const {
    std::ifstream in(json());
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::Subprocess> daemon_;
};

TEST_F(LoadBenchProcessTest, ReportsEveryCallOfEveryClient) {
  auto run = testing::RunProgramWithStderr(
      LoadBench({"--clients=3", "--iterations=4", "--fetches=10", "--hold=5", "--stores=2",
                 "--prefetches=1", "--prefetch-batch=2", "--busy-poll-us=100"}),
      kTimeout);
  ASSERT_THAT(run, IsOk());
  EXPECT_EQ(run->exit_code, 0) << run->output;
  const nlohmann::json result = Result();
  ASSERT_FALSE(result.is_discarded()) << run->output;
  EXPECT_EQ(result["workers_reporting"], 3);
  EXPECT_EQ(result["rounds"], 12);
  const nlohmann::json& operations = result["operations"];
  EXPECT_EQ(operations["fetch"]["count"], 3 * 4 * 10);
  EXPECT_EQ(operations["fetch_held"]["count"], 3 * 4 * 5);
  EXPECT_EQ(operations["store"]["count"], 3 * 4 * 2);
  EXPECT_EQ(operations["fetch_stored"]["count"], 3 * 4 * 2);
  EXPECT_EQ(operations["prefetch"]["count"], 3 * 4);
  EXPECT_EQ(result["fetches"], 3 * 4 * (10 + 5 + 2));
  EXPECT_TRUE(result["failures"].empty()) << result["failures"].dump();
  EXPECT_EQ(result["transports"]["socket"], 3);
  EXPECT_TRUE(result["daemon_cpu_s"].is_number());
  EXPECT_EQ(result["plan"]["busy_poll_us"], 100);
  const nlohmann::json& scheduling = result["scheduling"];
  EXPECT_GE(scheduling["machine"]["idle"].get<double>(), 0.0);
  EXPECT_LE(scheduling["machine"]["idle"].get<double>(), 1.0);
  if (std::filesystem::exists("/proc/self/schedstat")) {
    // Both sides ran in the timed phase (the daemon's session threads have ended by now: they
    // count up to their last sample).
    EXPECT_GT(scheduling["workers"]["timeslices"].get<uint64_t>(), 0u) << scheduling.dump();
    EXPECT_GT(scheduling["workers"]["on_cpu_s"].get<double>(), 0.0) << scheduling.dump();
    EXPECT_GE(scheduling["daemon"]["on_cpu_s"].get<double>(), 0.0) << scheduling.dump();
    EXPECT_GE(scheduling["daemon"]["waiting_s"].get<double>(), 0.0) << scheduling.dump();
  }
  EXPECT_TRUE(result["daemon_answers_after"].get<bool>());
  EXPECT_THAT(run->output, HasSubstr("3 clients (3 reported; sessions: socket 3)"));
}

TEST_F(LoadBenchProcessTest, ADaemonThatStopsAnsweringCostsTheRunItsDeadlines) {
  const absl::Time start = absl::Now();
  auto bench = testing::Subprocess::Start(
      LoadBench({"--clients=2", "--duration=5", "--grace=1", "--setup-timeout=5", "--stores=0"}));
  ASSERT_THAT(bench, IsOk());
  absl::SleepFor(absl::Seconds(2));
  // From here on every call waits: in the setup or the timed phase.
  ASSERT_THAT(daemon_->Stop(kTimeout), IsOk());
  absl::StatusOr<int> exit_code = (*bench)->Wait(absl::Seconds(90));
  daemon_->Signal(SIGCONT);
  ASSERT_THAT(exit_code, IsOk()) << "load_bench hangs with its daemon";
  EXPECT_EQ(*exit_code, 1);
  // 5 s of setup or of timed phase, 1 s of grace, the parent's 10 s margin, its last call's 10 s.
  EXPECT_LT(absl::Now() - start, absl::Seconds(45));
  const nlohmann::json result = Result();
  ASSERT_FALSE(result.is_discarded());
  EXPECT_EQ(result["failures"]["worker"]["count"], 2) << result["failures"].dump();
  EXPECT_FALSE(result["daemon_answers_after"].get<bool>());
}

}  // namespace
}  // namespace tierd
