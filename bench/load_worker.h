// One load_bench worker: a process of its own with its own tierd::Client and Session, running the
// mix of data-path calls a model server makes against the daemon, and timing each call.
//
// The worker and the parent speak in three messages over a WorkerChannel
// (bench/worker_processes.h): the parent sends a LoadPlan; the worker connects, pins the plan's
// object and answers with a WorkerReport of phase "ready" (or "failed", ending there); the parent
// sends "go"; the worker runs until the plan's duration or rounds are done and answers with the
// phase "done" report. A worker stuck in a call past the plan's deadline sends what it has (phase
// "stuck") and exits.
#ifndef TIERD_BENCH_LOAD_WORKER_H_
#define TIERD_BENCH_LOAD_WORKER_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_support.h"
#include "bench/worker_processes.h"

namespace tierd::bench {

// One round of the mix; a count of 0 leaves that step out.
struct LoadMix {
  int fetches = 100;  // fetch + release of the pinned object, each fetch timed ("fetch")
  int hold = 100;     // fetch this many leases of it ("fetch_held"), then release them all
  int stores = 1;     // store an object and flush ("store"), then fetch it ("fetch_stored")
  uint64_t store_bytes = 1 << 20;
  int store_keys = 4;  // stored keys per worker, reused in turn
  int prefetches = 1;  // Session::Prefetch of the next prefetch_batch objects ("prefetch")
  int prefetch_batch = 4;
};

struct LoadPlan {
  std::string socket;
  std::string pinned_key;                  // the object every worker pins and fetches
  std::vector<std::string> prefetch_keys;  // other objects of the model, prefetched in turn
  std::string store_namespace;             // the worker's stored keys: NAMESPACE-<worker>/<n>
  LoadMix mix;
  double duration_s = 5;  // the timed phase; ignored when rounds > 0
  int64_t rounds = 0;     // rounds of the mix instead of a duration
  int warmup_fetches = 100;
  // After "go": how long the timed phase may take past its duration before the worker gives up.
  double grace_s = 30;
  // The workers' ClientOptions::session_busy_poll, in microseconds.
  int64_t busy_poll_us = 0;
};

// The operations timed, in the order the mix runs them.
inline const std::vector<std::string>& LoadOperations() {
  static const std::vector<std::string> kOperations = {"fetch", "fetch_held", "store",
                                                       "fetch_stored", "prefetch"};
  return kOperations;
}

// What one worker measured of one operation.
struct OperationRecord {
  std::vector<uint64_t> latency_ns;  // of each call that succeeded
  uint64_t failures = 0;
  std::vector<std::string> first_errors;  // the first few distinct failure messages
};

struct WorkerReport {
  int worker = 0;
  std::string phase;      // "ready", "failed", "done" or "stuck"
  std::string error;      // why the worker stopped early, if it did
  std::string transport;  // of the session: "socket" or "grpc"
  // The timed phase, in seconds of CLOCK_MONOTONIC (comparable across processes).
  double start_s = 0;
  double end_s = 0;
  int64_t rounds = 0;
  std::map<std::string, OperationRecord> operations;
  // How the scheduler treated the worker's threads over the timed phase; unset where the kernel
  // keeps no schedstat.
  std::optional<SchedulingTotals> scheduling;
};

nlohmann::json PlanToJson(const LoadPlan& plan);
LoadPlan PlanFromJson(const nlohmann::json& json);
// Reports travel as MessagePack (latencies are many integers).
std::string EncodeReport(const WorkerReport& report);
// INVALID_ARGUMENT when `bytes` is not an encoded report.
absl::StatusOr<WorkerReport> DecodeReport(const std::string& bytes);

// The worker's whole life (the WorkerProcesses body): receives the plan, connects, reports ready,
// waits for "go", runs the mix and reports. Returns the exit status: 0 when it sent its last
// report, 1 otherwise.
int RunLoadWorker(int worker, WorkerChannel& channel);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_LOAD_WORKER_H_
