// load_bench: many client processes against one daemon at once, as on a node where several model
// servers share one GPU's tierd.
//
//   load_bench --socket=SOCK --model=NAME [--model-dir=DIR] --clients=N [--duration=10]
//              [--daemon-pid=PID] [--json=OUT]
//
// Forks --clients worker processes before it creates any client itself; each opens its own
// tierd::Client and Session, pins the model's smallest object, and runs rounds of a mix for
// --duration seconds (or --iterations rounds), timing every call:
//   fetch         --fetches fetches of the pinned object, each released at once
//   fetch_held    --hold fetches of it held at once, then all released
//   store         --stores stores of --store-bytes (StoreAsync + Flush) under the worker's own
//                 namespace, each then fetched back (fetch_stored)
//   prefetch      --prefetches Session::Prefetch calls of --prefetch-batch other objects in turn
// The parent adds the workers' samples up: per operation the count, rate and p50/p99/p999, the
// fetches per second over all processes, the failures with their first messages, the daemon's
// CPU time over the run (--daemon-pid) and the workers', how long their threads waited for a CPU
// while runnable (schedstat) and the machine's CPU time by kind (steal included). It prints a
// table and writes --json.
// No wait has no deadline: a worker that fails, hangs or dies is reported, not waited for.
// The model is registered from --model-dir (one object per tensor) when the daemon lacks it.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_model.h"
#include "bench/bench_support.h"
#include "bench/load_report.h"
#include "bench/load_worker.h"
#include "bench/worker_processes.h"
#include "client/tierd_client.h"
#include "common/byte_size.h"
#include "common/command_line.h"

ABSL_FLAG(std::string, socket, "/run/tierd/gpu0.sock", "The daemon's socket");
ABSL_FLAG(std::string, model, "load", "The model to fetch and prefetch objects of");
ABSL_FLAG(std::string, model_dir, "",
          "Directory of the model's .safetensors files, to register it when the daemon lacks it");
ABSL_FLAG(int, clients, 1, "Worker processes, each with its own client and session");
ABSL_FLAG(double, duration, 10, "Seconds each worker runs the mix");
ABSL_FLAG(int64_t, iterations, 0, "Rounds of the mix per worker instead of --duration (0: off)");
ABSL_FLAG(int, fetches, 100, "Per round: fetch + release of the pinned object");
ABSL_FLAG(int, hold, 100, "Per round: leases of the pinned object held at once, then released");
ABSL_FLAG(int, stores, 1, "Per round: stores, each flushed and fetched back");
ABSL_FLAG(tierd::ByteSize, store_bytes, tierd::ByteSize{1ull << 20}, "Bytes per store");
ABSL_FLAG(int, store_keys, 4, "Keys each worker stores under, in turn");
ABSL_FLAG(int, prefetches, 1, "Per round: Session::Prefetch calls");
ABSL_FLAG(int, prefetch_batch, 4, "Objects per prefetch, the model's others in turn");
ABSL_FLAG(int, warmup, 100, "Untimed fetches per worker before the timed phase");
ABSL_FLAG(int, daemon_pid, 0, "The daemon's pid, for its CPU time (0: not measured)");
ABSL_FLAG(int64_t, busy_poll_us, 0,
          "The workers' ClientOptions::session_busy_poll: microseconds a caller polls for its "
          "answer before it sleeps");
ABSL_FLAG(double, setup_timeout, 60, "Seconds the workers may take to connect and pin");
ABSL_FLAG(double, grace, 30,
          "Seconds a worker may run past --duration (with --iterations: in all) before it gives "
          "up and reports what it has");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace tierd::bench {
namespace {

// The plan every worker gets: the smallest object pinned, the others prefetched in turn.
LoadPlan MakePlan(tierd::Client& client) {
  std::vector<Object> objects =
      RegisteredObjects(client, absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_model_dir));
  std::sort(objects.begin(), objects.end(), [](const Object& a, const Object& b) {
    return a.size != b.size ? a.size < b.size : a.key < b.key;
  });
  LoadPlan plan;
  plan.socket = absl::GetFlag(FLAGS_socket);
  plan.pinned_key = objects.front().key;
  for (size_t i = 1; i < objects.size(); ++i) plan.prefetch_keys.push_back(objects[i].key);
  plan.store_namespace = "load-bench";
  plan.mix.fetches = absl::GetFlag(FLAGS_fetches);
  plan.mix.hold = absl::GetFlag(FLAGS_hold);
  plan.mix.stores = absl::GetFlag(FLAGS_stores);
  plan.mix.store_bytes = absl::GetFlag(FLAGS_store_bytes).bytes;
  plan.mix.store_keys = absl::GetFlag(FLAGS_store_keys);
  plan.mix.prefetches = absl::GetFlag(FLAGS_prefetches);
  plan.mix.prefetch_batch = absl::GetFlag(FLAGS_prefetch_batch);
  plan.duration_s = absl::GetFlag(FLAGS_duration);
  plan.rounds = absl::GetFlag(FLAGS_iterations);
  plan.warmup_fetches = absl::GetFlag(FLAGS_warmup);
  plan.grace_s = absl::GetFlag(FLAGS_grace);
  plan.busy_poll_us = absl::GetFlag(FLAGS_busy_poll_us);
  return plan;
}

std::optional<double> DaemonCpuSeconds() {
  const int pid = absl::GetFlag(FLAGS_daemon_pid);
  if (pid <= 0) return std::nullopt;
  absl::StatusOr<double> seconds = ProcessCpuSeconds(pid);
  if (!seconds.ok()) {
    Progress(absl::StrCat("daemon CPU: ", seconds.status().ToString()));
    return std::nullopt;
  }
  return *seconds;
}

int Main(int argc, char** argv) {
  // As tierd does: Debian's Abseil, built without NDEBUG, tracks the order of every lock under one
  // process-wide lock; the workers would measure that instead of the session (docs/CLIENTS.md).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "load_bench --socket=SOCK --model=NAME [--model-dir=DIR] --clients=N [--duration=S] "
      "[--daemon-pid=PID] [--json=OUT]");
  if (absl::StatusOr<std::vector<std::string>> parsed =
          tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
      !parsed.ok()) {
    std::fprintf(stderr, "load_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const int clients = absl::GetFlag(FLAGS_clients);
  if (clients < 1) Die("--clients must be at least 1");
  std::string command;
  for (int i = 0; i < argc; ++i) absl::StrAppend(&command, i == 0 ? "" : " ", argv[i]);

  // The workers first: nothing of gRPC or the device may exist in a process that forks.
  std::unique_ptr<WorkerProcesses> workers =
      Check(WorkerProcesses::Start(clients, RunLoadWorker), "starting the workers");
  tierd::ClientOptions options;
  options.socket_path = absl::GetFlag(FLAGS_socket);
  options.client_name = "load_bench";
  // Registering a model has no deadline; the other calls are quick, the last one (is the daemon
  // still answering?) included.
  options.call_timeout = absl::Seconds(10);
  std::unique_ptr<tierd::Client> client = Check(tierd::Client::Connect(options), "connecting");
  const LoadPlan plan = MakePlan(*client);
  const std::string plan_message = PlanToJson(plan).dump();

  LoadRun run;
  run.clients = clients;
  std::map<int, std::string> trouble;  // worker → what went wrong, for its failure line
  std::vector<int> all;
  for (int i = 0; i < clients; ++i) {
    all.push_back(i);
    if (absl::Status sent = workers->Send(i, plan_message); !sent.ok()) {
      trouble[i] = absl::StrCat("the plan could not be sent: ", sent.message());
    }
  }
  auto decoded = [&](int worker, const absl::StatusOr<std::string>& message,
                     const char* waiting_for) -> std::optional<WorkerReport> {
    if (!message.ok()) {
      trouble[worker] =
          absl::StrCat("no ", waiting_for, " report (", message.status().message(), ")");
      return std::nullopt;
    }
    absl::StatusOr<WorkerReport> report = DecodeReport(*message);
    if (!report.ok()) {
      trouble[worker] = std::string(report.status().message());
      return std::nullopt;
    }
    return *std::move(report);
  };

  Progress(absl::StrFormat("%d client processes: setting up", clients));
  std::vector<int> ready;
  for (auto& [worker, message] : workers->ReceiveFromEach(
           all, absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_setup_timeout)))) {
    std::optional<WorkerReport> report = decoded(worker, message, "ready");
    if (!report.has_value()) continue;
    if (report->phase == "ready") {
      ready.push_back(worker);
    } else {
      trouble[worker] = report->error;
      run.reports.push_back(*std::move(report));
    }
  }

  const std::optional<double> cpu_before = DaemonCpuSeconds();
  std::optional<SchedulingSampler> daemon_scheduling;
  if (absl::GetFlag(FLAGS_daemon_pid) > 0) {
    daemon_scheduling.emplace(absl::GetFlag(FLAGS_daemon_pid), absl::Milliseconds(100));
  }
  const absl::StatusOr<MachineCpuTimes> machine_before = ReadMachineCpuTimes();
  const absl::Time go = absl::Now();
  for (int worker : ready) {
    if (absl::Status sent = workers->Send(worker, "go"); !sent.ok()) {
      trouble[worker] = absl::StrCat("could not be told to start: ", sent.message());
    }
  }
  Progress(absl::StrFormat("%d client processes: %d running", clients, ready.size()));
  const double allowed_s = (plan.rounds > 0 ? 0 : plan.duration_s) + plan.grace_s + 10;
  for (auto& [worker, message] : workers->ReceiveFromEach(ready, go + absl::Seconds(allowed_s))) {
    std::optional<WorkerReport> report = decoded(worker, message, "final");
    if (!report.has_value()) continue;
    if (report->phase != "done" || !report->error.empty()) {
      trouble[worker] = absl::StrCat(report->phase, ": ", report->error);
    }
    run.reports.push_back(*std::move(report));
  }
  run.wall_s = absl::ToDoubleSeconds(absl::Now() - go);
  const std::optional<double> cpu_after = DaemonCpuSeconds();
  if (cpu_before.has_value() && cpu_after.has_value()) run.daemon_cpu_s = *cpu_after - *cpu_before;
  if (daemon_scheduling.has_value()) run.daemon_scheduling = daemon_scheduling->Stop();
  const absl::StatusOr<MachineCpuTimes> machine_after = ReadMachineCpuTimes();
  if (machine_before.ok() && machine_after.ok()) {
    run.machine_cpu = machine_after->Since(*machine_before);
  }

  const std::vector<WorkerExit> exits = workers->Reap(absl::Now() + absl::Seconds(30));
  for (int i = 0; i < clients; ++i) {
    run.workers_cpu_s += exits[i].cpu_seconds;
    if (!exits[i].clean || trouble.count(i)) {
      std::string line = absl::StrCat("worker ", i, ": ");
      if (trouble.count(i)) absl::StrAppend(&line, trouble[i], "; ");
      absl::StrAppend(&line, exits[i].how);
      run.worker_failures.push_back(line);
    }
  }
  const absl::Status daemon_after = client->GetStats().status();

  nlohmann::json result = SummarizeLoadRun(run);
  result.update({{"benchmark", "load"},
                 {"date", TodayUtc()},
                 {"command", command},
                 {"model", absl::GetFlag(FLAGS_model)},
                 {"plan", PlanToJson(plan)},
                 {"daemon_answers_after", daemon_after.ok()}});
  result["plan"].erase("prefetch_keys");
  result["plan"]["prefetch_objects"] = plan.prefetch_keys.size();
  std::printf("%s", FormatLoadSummary(result).c_str());
  if (!daemon_after.ok()) {
    std::printf("  the daemon does not answer after the run: %s\n",
                daemon_after.ToString().c_str());
  }
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) {
    std::ofstream out(json);
    out << result.dump(2) << "\n";
    if (!out) Die("cannot write " + json);
  }
  return run.worker_failures.empty() && daemon_after.ok() ? 0 : 1;
}

}  // namespace
}  // namespace tierd::bench

int main(int argc, char** argv) { return tierd::bench::Main(argc, argv); }
