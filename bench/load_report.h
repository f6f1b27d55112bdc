// load_bench's results for one number of clients: the workers' reports added up into per-operation
// counts, rates and latency percentiles, the failures with their first messages, and the CPU the
// daemon and the workers spent; as JSON and as a table for people.
#ifndef TIERD_BENCH_LOAD_REPORT_H_
#define TIERD_BENCH_LOAD_REPORT_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/load_worker.h"

namespace tierd::bench {

struct LoadRun {
  int clients = 0;
  // The last report of each worker that sent one ("done", "stuck" or "failed").
  std::vector<WorkerReport> reports;
  // One line per worker that did not finish cleanly, e.g. "worker 3: no report (...); killed by
  // signal 9 (after the deadline)".
  std::vector<std::string> worker_failures;
  // From "go" until the last report came in, as the parent saw it.
  double wall_s = 0;
  // The daemon's user + system CPU over the same span; unset without its pid.
  std::optional<double> daemon_cpu_s;
  // The workers' user + system CPU over their whole lives.
  double workers_cpu_s = 0;
  // The scheduler's view of the daemon's threads over the same span as daemon_cpu_s, and the
  // machine's CPU time by kind; unset where they cannot be read.
  std::optional<SchedulingTotals> daemon_scheduling;
  std::optional<MachineCpuTimes> machine_cpu;
};

// Distinct messages kept per failure kind in the summary.
inline constexpr size_t kFailureMessagesKept = 5;

// {clients, workers_reporting, wall_s, timed_phase_s, fetches, fetches_per_s, operations: {NAME:
// {count, per_s, failures, latency: {count, p50_us, ...}}}, failures: {NAME|"worker": {count,
// first_messages}}, transports: {NAME: workers}, workers: [{worker, phase, rounds, fetches,
// fetch_p50_us, fetch_p99_us}], daemon_cpu_s, daemon_cpu_us_per_fetch, workers_cpu_s,
// scheduling: {daemon, workers: {on_cpu_s, waiting_s, timeslices, waiting_us_per_timeslice},
// machine: {user, system, idle, interrupts, steal: shares of all CPUs' time}}}.
// "fetches" adds up every operation whose name starts with "fetch".
nlohmann::json SummarizeLoadRun(const LoadRun& run);

// The summary as a few lines of text: the totals, one row per operation, the failures.
std::string FormatLoadSummary(const nlohmann::json& summary);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_LOAD_REPORT_H_
