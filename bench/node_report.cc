#include "bench/node_report.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"

namespace tierd::bench {
namespace {

std::string Bytes(const nlohmann::json& value) { return FormatByteSize(value.get<uint64_t>()); }

// A daemon's row: its throughput and what its stats say it moved.
std::string DaemonRow(const std::string& phase, const std::string& daemon,
                      const nlohmann::json& figures, double gb_per_s, double ratio) {
  return absl::StrFormat("%-9s %-7s %-8s %8.3f %7.3f %11s %11s %9llu %11s %9llu\n", phase, daemon,
                         figures.value("on", ""), gb_per_s, ratio,
                         Bytes(figures["bytes_disk_to_host"]), Bytes(figures["host_used_bytes"]),
                         figures["node_host_fetches"].get<unsigned long long>(),
                         Bytes(figures["bytes_node_host_to_gpu"]),
                         figures["node_fallbacks"].get<unsigned long long>());
}

// "PHASE runs: a, b, c GB/s (median b)" when the phase ran more than once.
std::string Runs(const std::string& phase, const nlohmann::json& phases,
                 const std::string& figure) {
  if (!phases.contains(phase) || !phases[phase].contains("runs_" + figure)) return "";
  const nlohmann::json& runs = phases[phase]["runs_" + figure];
  if (runs.size() < 2) return "";
  std::vector<std::string> values;
  for (const nlohmann::json& value : runs)
    values.push_back(absl::StrFormat("%.3f", value.get<double>()));
  return absl::StrFormat("%s runs: %s GB/s (median %.3f)\n", phase, absl::StrJoin(values, ", "),
                         phases[phase][figure].get<double>());
}

}  // namespace

std::string FormatRatio(const nlohmann::json& ratio) {
  return ratio.is_null() ? "unknown" : absl::StrFormat("%.3f", ratio.get<double>());
}

std::string FormatNodeReport(const nlohmann::json& result) {
  const nlohmann::json& model = result["model"];
  std::string text = absl::StrFormat(
      "node_bench, %s: %d daemons on %s; model %s (%d objects) in %s%s\n\n",
      result.value("date", ""), result["daemons"]["count"].get<int>(),
      absl::StrJoin(result["daemons"]["devices"].get<std::vector<std::string>>(), ", "),
      Bytes(model["bytes"]), model["objects"].get<int>(), model.value("dir", ""),
      model.value("on_tmpfs", false) ? " (tmpfs)" : "");
  absl::StrAppend(&text,
                  "phase     daemon  on           GB/s  /alone   disk→host   host used  from home"
                  "    home→GPU  fallbacks\n");
  const nlohmann::json& phases = result["phases"];
  if (phases.contains("alone")) {
    nlohmann::json figures = phases["alone"]["stats"];
    figures["on"] = phases["alone"]["device"];
    absl::StrAppend(
        &text, DaemonRow("alone", "0", figures, phases["alone"]["gb_per_s"].get<double>(), 1.0));
  }
  if (phases.contains("together")) {
    const nlohmann::json& together = phases["together"];
    for (const nlohmann::json& daemon : together["daemons"]) {
      absl::StrAppend(&text, DaemonRow("together", std::to_string(daemon["daemon"].get<int>()),
                                       daemon, daemon["gb_per_s"].get<double>(),
                                       daemon["ratio_to_alone"].get<double>()));
    }
    absl::StrAppend(&text, Runs("alone", phases, "gb_per_s"),
                    Runs("together", phases, "aggregate_gb_per_s"));
    absl::StrAppendFormat(&text, "\ntogether: the node %.3f GB/s over %.2f s (%s)\n",
                          together["aggregate_gb_per_s"].get<double>(),
                          together["span_s"].get<double>(), together.value("cold", ""));
    absl::StrAppendFormat(&text,
                          "  each daemon (a GPU's, on a node): at worst %.3f of alone (goal >= "
                          "0.90)\n",
                          together["worst_daemon_ratio_to_alone"].get<double>());
    for (const nlohmann::json& device : together["devices"]) {
      absl::StrAppendFormat(&text, "  %s (daemons %s): %.3f GB/s, %.3f of alone\n",
                            device["device"].get<std::string>(),
                            absl::StrJoin(device["daemons"].get<std::vector<int>>(), ","),
                            device["gb_per_s"].get<double>(),
                            device["ratio_to_alone"].get<double>());
    }
    absl::StrAppendFormat(&text,
                          "  disk bytes / model bytes %.2f (goal 1.0); host bytes holding the "
                          "model / model bytes %.2f (goal 1.0)\n",
                          together["disk_bytes_over_model"].get<double>(),
                          together["host_bytes_over_model"].get<double>());
  }
  if (phases.contains("warm")) {
    const nlohmann::json& warm = phases["warm"];
    absl::StrAppendFormat(
        &text,
        "\nwarm (all daemons at once, median of %d): tierd %.2f GB/s, reference %.2f GB/s, "
        "ratio %.3f (goal >= 0.90); read from disk meanwhile: %s\n  reference: %s\n",
        warm["repeat"].get<int>(), warm["tierd_median_gb_per_s"].get<double>(),
        warm["reference_median_gb_per_s"].get<double>(), warm["ratio"].get<double>(),
        Bytes(warm["disk_bytes_during_warm"]), warm["reference"].get<std::string>());
  }
  for (const char* name : {"tp_dim0", "tp_dim1"}) {
    if (!phases.contains(name)) continue;
    const nlohmann::json& tp = phases[name];
    absl::StrAppendFormat(
        &text,
        "\n%s (%zu ranks, one per daemon, cold, at once): node %.3f GB/s; disk bytes / model %.3f "
        "(%.3f read with the rounding to blocks, %s from the device; goal 1.0); slowest rank "
        "%.3f s, goal <= %.3f s (alone %.3f s / ranks + 10%%)\n",
        name, tp["ranks"].size(), tp["aggregate_gb_per_s"].get<double>(),
        tp["disk_bytes_over_model"].get<double>(), tp["disk_bytes_read_over_model"].get<double>(),
        FormatRatio(tp.value("device_bytes_read_over_model", nlohmann::json())),
        tp["worst_rank_seconds"].get<double>(), tp["goal_rank_seconds_at_most"].get<double>(),
        tp["alone_seconds"].get<double>());
    for (const nlohmann::json& rank : tp["ranks"]) {
      absl::StrAppendFormat(
          &text, "  rank %d on %s: %s in %.3f s (%.3f GB/s), %.3f of alone / ranks\n",
          rank["rank"].get<int>(), rank["on"].get<std::string>(), Bytes(rank["bytes_fetched"]),
          rank["seconds"].get<double>(), rank["gb_per_s"].get<double>(),
          rank["seconds_over_alone_per_rank"].get<double>());
    }
    if (tp.contains("warm")) {
      const nlohmann::json& warm = tp["warm"];
      absl::StrAppendFormat(
          &text,
          "  warm (median of %d): all ranks %.2f GB/s, one GPU's copy %.2f GB/s, ratio to %d "
          "GPU(s) x that %.3f (goal >= 0.90); read from disk meanwhile: %s\n",
          warm["repeat"].get<int>(), warm["tierd_median_gb_per_s"].get<double>(),
          warm["single_gpu_copy_median_gb_per_s"].get<double>(), warm["gpus"].get<int>(),
          warm["ratio_to_gpus_times_single"].get<double>(),
          Bytes(warm["disk_bytes_read_during_warm"]));
    }
    if (tp.contains("throughput_over_dim0")) {
      absl::StrAppendFormat(&text, "  dim 1 / dim 0 node throughput %.3f (goal >= 0.8)\n",
                            tp["throughput_over_dim0"].get<double>());
    }
  }
  return text;
}

}  // namespace tierd::bench
