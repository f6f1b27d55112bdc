// load_bench's parts: the worker processes and their messages, the reports' encoding, and the
// summary the parent makes of them.
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "bench/load_report.h"
#include "bench/load_worker.h"
#include "bench/worker_processes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

TEST(FrameMessageTest, WholeMessagesComeOffTheFrontOneAtATime) {
  std::string buffer = FrameMessage("first") + FrameMessage("") + FrameMessage("third");
  const std::string partial = buffer.substr(0, buffer.size() - 2);
  std::string message;
  ASSERT_TRUE(TakeMessage(buffer, message));
  EXPECT_EQ(message, "first");
  ASSERT_TRUE(TakeMessage(buffer, message));
  EXPECT_EQ(message, "");
  ASSERT_TRUE(TakeMessage(buffer, message));
  EXPECT_EQ(message, "third");
  EXPECT_FALSE(TakeMessage(buffer, message));

  std::string cut = partial;
  ASSERT_TRUE(TakeMessage(cut, message));
  ASSERT_TRUE(TakeMessage(cut, message));
  EXPECT_FALSE(TakeMessage(cut, message)) << "the third message lacks its last two bytes";
}

TEST(WorkerProcessesTest, WorkersAnswerThroughTheirOwnPipes) {
  absl::StatusOr<std::unique_ptr<WorkerProcesses>> workers =
      WorkerProcesses::Start(3, [](int index, WorkerChannel& channel) {
        absl::StatusOr<std::string> question = channel.Receive(absl::Now() + absl::Seconds(30));
        if (!question.ok()) return 1;
        return channel.Send(*question + " from " + std::to_string(index)).ok() ? 0 : 1;
      });
  ASSERT_THAT(workers, IsOk());
  for (int i = 0; i < 3; ++i) ASSERT_THAT((*workers)->Send(i, "hello"), IsOk());
  auto answers = (*workers)->ReceiveFromEach({0, 1, 2}, absl::Now() + absl::Seconds(30));
  ASSERT_EQ(answers.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_THAT(answers.at(i), IsOk());
    EXPECT_EQ(*answers.at(i), "hello from " + std::to_string(i));
  }
  for (const WorkerExit& exit : (*workers)->Reap(absl::Now() + absl::Seconds(30))) {
    EXPECT_TRUE(exit.clean) << exit.how;
  }
}

TEST(WorkerProcessesTest, AHungOrDeadWorkerCostsTheParentOnlyItsDeadline) {
  // Worker 0 never answers; worker 1 ends without answering.
  absl::StatusOr<std::unique_ptr<WorkerProcesses>> workers =
      WorkerProcesses::Start(2, [](int index, WorkerChannel&) {
        if (index == 1) return 7;
        for (;;) ::pause();
      });
  ASSERT_THAT(workers, IsOk());
  const absl::Time start = absl::Now();
  auto answers = (*workers)->ReceiveFromEach({0, 1}, start + absl::Milliseconds(300));
  EXPECT_THAT(answers.at(0), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(answers.at(1), StatusIs(absl::StatusCode::kUnavailable));
  const std::vector<WorkerExit> exits = (*workers)->Reap(absl::Now() + absl::Milliseconds(100));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_FALSE(exits[0].clean);
  EXPECT_EQ(exits[0].how, "killed by signal 9 (after the deadline)");
  EXPECT_FALSE(exits[1].clean);
  EXPECT_EQ(exits[1].how, "exited 7");
  EXPECT_THAT((*workers)->Send(1, "anyone?"), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(WorkerReportTest, SurvivesEncodingAndRefusesGarbage) {
  WorkerReport report;
  report.worker = 3;
  report.phase = "done";
  report.transport = "socket";
  report.start_s = 10.5;
  report.end_s = 12.25;
  report.rounds = 7;
  report.operations["fetch"].latency_ns = {40000, 50000, 5000000000ull};
  report.operations["store"].failures = 2;
  report.operations["store"].first_errors = {"RESOURCE_EXHAUSTED: full"};
  absl::StatusOr<WorkerReport> decoded = DecodeReport(EncodeReport(report));
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->worker, 3);
  EXPECT_EQ(decoded->phase, "done");
  EXPECT_EQ(decoded->transport, "socket");
  EXPECT_EQ(decoded->start_s, 10.5);
  EXPECT_EQ(decoded->end_s, 12.25);
  EXPECT_EQ(decoded->rounds, 7);
  EXPECT_THAT(decoded->operations.at("fetch").latency_ns, ElementsAre(40000, 50000, 5000000000ull));
  EXPECT_EQ(decoded->operations.at("store").failures, 2u);
  EXPECT_THAT(decoded->operations.at("store").first_errors,
              ElementsAre("RESOURCE_EXHAUSTED: full"));

  EXPECT_THAT(DecodeReport("not a report"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LoadPlanTest, SurvivesJson) {
  LoadPlan plan;
  plan.socket = "/run/tierd/gpu0.sock";
  plan.pinned_key = "m/a";
  plan.prefetch_keys = {"m/b", "m/c"};
  plan.mix.hold = 7;
  plan.mix.store_bytes = 3 << 20;
  plan.rounds = 11;
  const LoadPlan copy = PlanFromJson(nlohmann::json::parse(PlanToJson(plan).dump()));
  EXPECT_EQ(copy.socket, plan.socket);
  EXPECT_EQ(copy.pinned_key, "m/a");
  EXPECT_THAT(copy.prefetch_keys, ElementsAre("m/b", "m/c"));
  EXPECT_EQ(copy.mix.hold, 7);
  EXPECT_EQ(copy.mix.store_bytes, 3u << 20);
  EXPECT_EQ(copy.rounds, 11);
}

WorkerReport FetchReport(int worker, double start_s, double end_s, std::vector<uint64_t> ns) {
  WorkerReport report;
  report.worker = worker;
  report.phase = "done";
  report.transport = "socket";
  report.start_s = start_s;
  report.end_s = end_s;
  report.operations["fetch"].latency_ns = std::move(ns);
  return report;
}

TEST(SummarizeLoadRunTest, AddsUpWorkersOverTheSpanTheyRan) {
  LoadRun run;
  run.clients = 3;
  // 100 fetches of 1..100 us over workers 0 and 1, which together ran from t=100 s to t=102 s.
  std::vector<uint64_t> first, second;
  for (uint64_t us = 1; us <= 100; ++us) (us % 2 ? first : second).push_back(us * 1000);
  run.reports.push_back(FetchReport(0, 100.0, 101.5, first));
  run.reports.push_back(FetchReport(1, 100.5, 102.0, second));
  run.reports[1].operations["fetch_held"].latency_ns = {10000, 20000};
  run.reports[1].operations["store"].failures = 3;
  run.reports[1].operations["store"].first_errors = {"RESOURCE_EXHAUSTED: full"};
  run.reports[0].operations["store"].failures = 1;
  run.reports[0].operations["store"].first_errors = {"RESOURCE_EXHAUSTED: full"};
  run.worker_failures = {
      "worker 2: no final report (the worker ended without sending it); exited 1"};
  run.daemon_cpu_s = 0.5;

  const nlohmann::json summary = SummarizeLoadRun(run);
  EXPECT_EQ(summary["timed_phase_s"].get<double>(), 2.0);
  EXPECT_EQ(summary["fetches"].get<uint64_t>(), 102u) << "fetch and fetch_held both count";
  EXPECT_EQ(summary["fetches_per_s"].get<double>(), 51.0);
  EXPECT_EQ(summary["operations"]["fetch"]["latency"]["p50_us"].get<double>(), 50.0);
  EXPECT_EQ(summary["operations"]["fetch"]["latency"]["p99_us"].get<double>(), 99.0);
  EXPECT_EQ(summary["operations"]["fetch"]["latency"]["max_us"].get<double>(), 100.0);
  EXPECT_EQ(summary["operations"]["store"]["count"].get<uint64_t>(), 0u);
  EXPECT_EQ(summary["operations"]["store"]["failures"].get<uint64_t>(), 4u);
  EXPECT_EQ(summary["failures"]["store"]["count"].get<uint64_t>(), 4u);
  EXPECT_EQ(summary["failures"]["store"]["first_messages"].size(), 1u) << "distinct messages";
  EXPECT_EQ(summary["failures"]["worker"]["count"].get<uint64_t>(), 1u);
  EXPECT_EQ(summary["transports"]["socket"].get<int>(), 2);
  EXPECT_DOUBLE_EQ(summary["daemon_cpu_us_per_fetch"].get<double>(), 0.5e6 / 102);
  ASSERT_EQ(summary["workers"].size(), 2u);
  EXPECT_EQ(summary["workers"][0]["fetches"].get<uint64_t>(), 50u);
  EXPECT_EQ(summary["workers"][1]["fetches"].get<uint64_t>(), 52u);
  EXPECT_EQ(summary["workers"][1]["fetch_p50_us"].get<double>(), 50.0) << "2, 4, ..., 100 us";

  const std::string text = FormatLoadSummary(summary);
  EXPECT_THAT(text, HasSubstr("3 clients (2 reported; sessions: socket 2)"));
  EXPECT_THAT(text, HasSubstr("fetches per worker: 50 to 52"));
  EXPECT_THAT(text, HasSubstr("failures of worker: 1"));
  EXPECT_THAT(text, HasSubstr("worker 2: no final report"));
}

TEST(ProcessCpuSecondsTest, ReadsThisProcessAndRefusesAMissingOne) {
  const absl::StatusOr<double> before = ProcessCpuSeconds(::getpid());
  ASSERT_THAT(before, IsOk());
  // Spin until a clock tick of CPU time shows (10 ms), or give up after 10 s.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  absl::StatusOr<double> after = before;
  volatile uint64_t sink = 0;
  while (after.ok() && *after == *before && std::chrono::steady_clock::now() < give_up) {
    for (int i = 0; i < 1000000; ++i) sink = sink + 1;
    after = ProcessCpuSeconds(::getpid());
  }
  ASSERT_THAT(after, IsOk());
  EXPECT_GT(*after, *before) << "spinning shows in the process's CPU time";
  EXPECT_THAT(ProcessCpuSeconds(1 << 30), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace tierd::bench
