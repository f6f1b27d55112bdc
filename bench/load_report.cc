#include "bench/load_report.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_support.h"

namespace tierd::bench {
namespace {

struct Failures {
  uint64_t count = 0;
  std::vector<std::string> first_messages;

  void Add(uint64_t how_many, const std::vector<std::string>& messages) {
    count += how_many;
    for (const std::string& message : messages) {
      if (first_messages.size() < kFailureMessagesKept &&
          std::find(first_messages.begin(), first_messages.end(), message) ==
              first_messages.end()) {
        first_messages.push_back(message);
      }
    }
  }
};

}  // namespace

nlohmann::json SummarizeLoadRun(const LoadRun& run) {
  double first_start = std::numeric_limits<double>::max();
  double last_end = 0;
  std::map<std::string, std::vector<double>> latencies_us;
  std::map<std::string, Failures> failures;
  std::map<std::string, int> transports;
  int64_t rounds = 0;
  for (const WorkerReport& report : run.reports) {
    if (report.start_s > 0) {
      first_start = std::min(first_start, report.start_s);
      last_end = std::max(last_end, report.end_s);
    }
    rounds += report.rounds;
    if (!report.transport.empty()) ++transports[report.transport];
    for (const auto& [name, record] : report.operations) {
      std::vector<double>& us = latencies_us[name];
      for (uint64_t ns : record.latency_ns) us.push_back(static_cast<double>(ns) / 1e3);
      if (record.failures > 0) failures[name].Add(record.failures, record.first_errors);
    }
  }
  for (const std::string& line : run.worker_failures) failures["worker"].Add(1, {line});
  const double timed_phase_s = last_end > first_start ? last_end - first_start : 0;
  auto per_second = [&](double count) { return timed_phase_s > 0 ? count / timed_phase_s : 0.0; };

  uint64_t fetches = 0;
  nlohmann::json operations = nlohmann::json::object();
  std::vector<std::string> names = LoadOperations();
  for (const auto& [name, us] : latencies_us) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  for (const std::string& name : names) {
    auto found = latencies_us.find(name);
    if (found == latencies_us.end()) continue;
    const uint64_t count = found->second.size();
    if (absl::StartsWith(name, "fetch")) fetches += count;
    operations[name] = {{"count", count},
                        {"per_s", per_second(static_cast<double>(count))},
                        {"failures", failures.count(name) ? failures[name].count : 0},
                        {"latency", LatencySummary(std::move(found->second))}};
  }
  // Each worker's share: whether the daemon serves the processes alike.
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerReport& report : run.reports) {
    uint64_t worker_fetches = 0;
    std::vector<double> fetch_us;
    for (const auto& [name, record] : report.operations) {
      if (absl::StartsWith(name, "fetch")) worker_fetches += record.latency_ns.size();
      if (name != "fetch") continue;
      for (uint64_t ns : record.latency_ns) fetch_us.push_back(static_cast<double>(ns) / 1e3);
    }
    std::sort(fetch_us.begin(), fetch_us.end());
    workers.push_back({{"worker", report.worker},
                       {"phase", report.phase},
                       {"rounds", report.rounds},
                       {"fetches", worker_fetches},
                       {"fetch_p50_us", PercentileOfSorted(fetch_us, 0.5)},
                       {"fetch_p99_us", PercentileOfSorted(fetch_us, 0.99)}});
  }
  std::sort(workers.begin(), workers.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["worker"].get<int>() < b["worker"].get<int>();
  });
  nlohmann::json failure_json = nlohmann::json::object();
  for (const auto& [kind, failed] : failures) {
    failure_json[kind] = {{"count", failed.count}, {"first_messages", failed.first_messages}};
  }
  nlohmann::json summary = {{"clients", run.clients},
                            {"workers_reporting", run.reports.size()},
                            {"wall_s", run.wall_s},
                            {"timed_phase_s", timed_phase_s},
                            {"rounds", rounds},
                            {"fetches", fetches},
                            {"fetches_per_s", per_second(static_cast<double>(fetches))},
                            {"operations", operations},
                            {"failures", failure_json},
                            {"transports", transports},
                            {"workers", workers},
                            {"workers_cpu_s", run.workers_cpu_s}};
  if (run.daemon_cpu_s.has_value()) {
    summary["daemon_cpu_s"] = *run.daemon_cpu_s;
    summary["daemon_cpu_us_per_fetch"] =
        fetches > 0 ? *run.daemon_cpu_s * 1e6 / static_cast<double>(fetches) : 0.0;
  } else {
    summary["daemon_cpu_s"] = nullptr;
  }
  const auto scheduling_json = [](const SchedulingTotals& totals) {
    return nlohmann::json{
        {"on_cpu_s", totals.on_cpu_s},
        {"waiting_s", totals.waiting_s},
        {"timeslices", totals.timeslices},
        {"waiting_us_per_timeslice",
         totals.timeslices > 0 ? totals.waiting_s * 1e6 / static_cast<double>(totals.timeslices)
                               : 0.0}};
  };
  nlohmann::json scheduling = nlohmann::json::object();
  if (run.daemon_scheduling.has_value()) {
    scheduling["daemon"] = scheduling_json(*run.daemon_scheduling);
  }
  SchedulingTotals workers_scheduling;
  bool workers_scheduled = false;
  for (const WorkerReport& report : run.reports) {
    if (!report.scheduling.has_value()) continue;
    workers_scheduling.Add(*report.scheduling);
    workers_scheduled = true;
  }
  if (workers_scheduled) scheduling["workers"] = scheduling_json(workers_scheduling);
  if (run.machine_cpu.has_value() && run.machine_cpu->total() > 0) {
    const MachineCpuTimes& cpu = *run.machine_cpu;
    scheduling["machine"] = {{"user", cpu.user / cpu.total()},
                             {"system", cpu.system / cpu.total()},
                             {"idle", cpu.idle / cpu.total()},
                             {"interrupts", cpu.interrupts / cpu.total()},
                             {"steal", cpu.steal / cpu.total()}};
  }
  summary["scheduling"] = scheduling;
  return summary;
}

std::string FormatLoadSummary(const nlohmann::json& summary) {
  std::string transports;
  for (const auto& [name, workers] : summary["transports"].items()) {
    absl::StrAppend(&transports, transports.empty() ? "" : ", ", name, " ", workers.get<int>());
  }
  std::string text = absl::StrFormat(
      "%d client%s (%d reported; sessions: %s): %.2f s timed, %.0f fetches/s over all of them",
      summary["clients"].get<int>(), summary["clients"].get<int>() == 1 ? "" : "s",
      summary["workers_reporting"].get<int>(), transports.empty() ? "none" : transports,
      summary["timed_phase_s"].get<double>(), summary["fetches_per_s"].get<double>());
  if (!summary["daemon_cpu_s"].is_null()) {
    const double timed = summary["timed_phase_s"].get<double>();
    absl::StrAppendFormat(&text, "; daemon CPU %.2f s (%.0f%% of one core, %.1f us per fetch)",
                          summary["daemon_cpu_s"].get<double>(),
                          timed > 0 ? 100 * summary["daemon_cpu_s"].get<double>() / timed : 0.0,
                          summary["daemon_cpu_us_per_fetch"].get<double>());
  }
  absl::StrAppendFormat(&text, "; workers' CPU %.2f s\n", summary["workers_cpu_s"].get<double>());
  const nlohmann::json& scheduling = summary["scheduling"];
  for (const char* who : {"daemon", "workers"}) {
    if (!scheduling.contains(who)) continue;
    const nlohmann::json& totals = scheduling[who];
    absl::StrAppendFormat(&text,
                          "  %s: %.2f s on a CPU, %.2f s waiting for one over %d timeslices "
                          "(%.1f us each)\n",
                          who, totals["on_cpu_s"].get<double>(), totals["waiting_s"].get<double>(),
                          totals["timeslices"].get<uint64_t>(),
                          totals["waiting_us_per_timeslice"].get<double>());
  }
  if (scheduling.contains("machine")) {
    const nlohmann::json& machine = scheduling["machine"];
    absl::StrAppendFormat(
        &text,
        "  machine: user %.0f%%, system %.0f%%, interrupts %.0f%%, steal %.1f%%, "
        "idle %.0f%%\n",
        100 * machine["user"].get<double>(), 100 * machine["system"].get<double>(),
        100 * machine["interrupts"].get<double>(), 100 * machine["steal"].get<double>(),
        100 * machine["idle"].get<double>());
  }
  absl::StrAppendFormat(&text, "  %-13s %10s %10s %9s %9s %9s %9s %8s\n", "operation", "count",
                        "per s", "p50 us", "p99 us", "p999 us", "max us", "failed");
  for (const auto& [name, operation] : summary["operations"].items()) {
    const nlohmann::json& latency = operation["latency"];
    absl::StrAppendFormat(&text, "  %-13s %10d %10.0f %9.1f %9.1f %9.1f %9.1f %8d\n", name,
                          operation["count"].get<uint64_t>(), operation["per_s"].get<double>(),
                          latency["p50_us"].get<double>(), latency["p99_us"].get<double>(),
                          latency["p999_us"].get<double>(), latency["max_us"].get<double>(),
                          operation["failures"].get<uint64_t>());
  }
  uint64_t fewest = std::numeric_limits<uint64_t>::max(), most = 0;
  for (const nlohmann::json& worker : summary["workers"]) {
    fewest = std::min(fewest, worker["fetches"].get<uint64_t>());
    most = std::max(most, worker["fetches"].get<uint64_t>());
  }
  if (summary["workers"].size() > 1) {
    absl::StrAppendFormat(&text, "  fetches per worker: %d to %d\n", fewest, most);
  }
  for (const auto& [kind, failed] : summary["failures"].items()) {
    absl::StrAppendFormat(&text, "  failures of %s: %d\n", kind, failed["count"].get<uint64_t>());
    for (const nlohmann::json& message : failed["first_messages"]) {
      absl::StrAppend(&text, "    ", message.get<std::string>(), "\n");
    }
  }
  return text;
}

}  // namespace tierd::bench
