#include "bench/node_phases.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_model.h"
#include "bench/bench_support.h"
#include "bench/node_report.h"
#include "common/byte_size.h"
#include "device/shared_memory.h"

namespace tierd::bench {
namespace {

// What the clients' timed rounds give: each one's GB/s, and the node's over the span from the
// first start to the last end.
struct Round {
  std::vector<double> start_s, end_s;
  std::vector<double> gb_per_s;
  std::vector<uint64_t> bytes;  // fetched (or copied) by each client
  double span_s = 0;
  double aggregate_gb_per_s = 0;
};

Round Summarize(const std::vector<nlohmann::json>& answers) {
  Round round;
  double first_start = 0, last_end = 0, bytes = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    const double start = answers[i]["start_s"].get<double>();
    const double end = answers[i]["end_s"].get<double>();
    const double object_bytes = answers[i]["bytes"].get<double>();
    round.start_s.push_back(start);
    round.end_s.push_back(end);
    round.gb_per_s.push_back(object_bytes / 1e9 / (end - start));
    round.bytes.push_back(answers[i]["bytes"].get<uint64_t>());
    first_start = i == 0 ? start : std::min(first_start, start);
    last_end = i == 0 ? end : std::max(last_end, end);
    bytes += object_bytes;
  }
  round.span_s = last_end - first_start;
  round.aggregate_gb_per_s = bytes / 1e9 / round.span_s;
  return round;
}

// Drops the page cache where that makes the load cold, and says what "cold" meant.
nlohmann::json MakeCold(const NodePlan& plan) {
  if (plan.model_on_tmpfs) {
    return {{"page_cache_dropped", false},
            {"cold", "the model is on tmpfs: cold means only not in the daemons' host caches"}};
  }
  if (!plan.drop_caches) {
    return {{"page_cache_dropped", false},
            {"cold", "--drop-caches=false: the files may be in the page cache"}};
  }
  const bool dropped = DropPageCache();
  return {{"page_cache_dropped", dropped},
          {"cold", dropped ? "page cache dropped, fresh daemons"
                           : "the page cache could not be dropped (not root?)"}};
}

// The figures of a daemon's stats the node phases report.
nlohmann::json DaemonFigures(const tierd::v1::Stats& stats) {
  return {{"device", stats.device()},
          {"bytes_disk_to_host", stats.bytes_disk_to_host()},
          {"disk_bytes_read", stats.disk_bytes_read()},
          {"bytes_host_to_gpu", stats.bytes_host_to_gpu()},
          {"host_used_bytes", stats.host().used_bytes()},
          {"host_pinned_bytes", stats.host_pinned_bytes()},
          {"host_budget_bytes", stats.host().budget_bytes()},
          {"node_daemons", stats.node_daemons()},
          {"node_objects_homed", stats.node_objects_homed()},
          {"node_host_fetches", stats.node_host_fetches()},
          {"bytes_node_host_to_gpu", stats.bytes_node_host_to_gpu()},
          {"node_host_leases_served", stats.node_host_leases_served()},
          {"node_host_leases", stats.node_host_leases()},
          {"node_fallbacks", stats.node_fallbacks()}};
}

std::unique_ptr<NodeDaemons> StartWithModel(const NodePlan& plan, int count, bool with_peers,
                                            const std::string& label) {
  std::unique_ptr<NodeDaemons> daemons =
      Check(NodeDaemons::Start(plan.daemons, count, with_peers, label),
            absl::StrCat(label, ": starting ", count, " daemon(s)"));
  for (int i = 0; i < count; ++i) RegisteredObjects(daemons->client(i), plan.model, plan.model_dir);
  return daemons;
}

std::vector<nlohmann::json> ConnectClients(const NodePlan& plan, NodeClients& clients,
                                           NodeDaemons& daemons) {
  std::vector<nlohmann::json> requests;
  for (int i = 0; i < daemons.count(); ++i) {
    requests.push_back({{"op", "connect"}, {"socket", daemons.socket(i)}, {"model", plan.model}});
  }
  return clients.AskEach(FirstWorkers(daemons.count()), requests);
}

void Disconnect(NodeClients& clients, int count) {
  clients.Ask(FirstWorkers(count), {{"op", "disconnect"}});
}

// One POSIX shared-memory buffer of `bytes`, named `name` under this process's prefix, mapped (and
// registered) by the clients of `workers`, which copy from it once, untimed: the first touch of
// the buffers. `what` names the phase in a failure.
std::unique_ptr<tierd::SharedMemory> MapReference(NodeClients& clients,
                                                  const std::vector<int>& workers, uint64_t bytes,
                                                  const std::string& name,
                                                  const std::string& what) {
  std::unique_ptr<tierd::SharedMemory> shared =
      Check(tierd::SharedMemory::Create(
                absl::StrCat(tierd::SharedMemoryPrefixForPid(::getpid()), name), bytes),
            what + ": the shared reference buffer");
  std::memset(shared->data(), 0x5a, bytes);
  clients.Ask(workers, {{"op", "map_reference"}, {"shm", shared->name()}});
  clients.Ask(workers, {{"op", "copy_reference"}});
  return shared;
}

// The tensor-parallel load again, warm: the checkpoint in the node's host tier (read by the cold
// load), evicted from the GPUs, every rank loading its shards at once, --repeat times. Against the
// host → GPU copy rate of one GPU in the same run: rank 0's client alone copying the model's
// bytes from a pinned shared buffer; the goal is 0.9 of that times the GPUs the ranks are on.
nlohmann::json RunWarmTensorParallel(const NodePlan& plan, NodeClients& clients,
                                     NodeDaemons& daemons,
                                     const std::vector<nlohmann::json>& requests,
                                     uint64_t model_bytes, const std::string& label) {
  const int count = daemons.count();
  const std::vector<int> all = FirstWorkers(count);
  auto disk_read = [&] {
    uint64_t bytes = 0;
    for (int i = 0; i < count; ++i) {
      bytes += Check(daemons.client(i).GetStats(), label + " warm: stats").disk_bytes_read();
    }
    return bytes;
  };
  const uint64_t disk_before = disk_read();
  const std::unique_ptr<tierd::SharedMemory> shared =
      MapReference(clients, {0}, model_bytes, "node-bench-tp-reference", label + " warm");
  std::vector<double> tierd_runs, single_runs;
  for (int run = 0; run < plan.repeat; ++run) {
    clients.Ask(all, {{"op", "evict_gpu"}});
    const Round loaded = Summarize(clients.AskEach(all, requests));
    const Round single = Summarize(clients.Ask({0}, {{"op", "copy_reference"}}));
    tierd_runs.push_back(loaded.aggregate_gb_per_s);
    single_runs.push_back(single.aggregate_gb_per_s);
    Progress(absl::StrFormat("%s warm run %d: all ranks %.2f GB/s; one GPU's copy %.2f GB/s", label,
                             run, tierd_runs.back(), single_runs.back()));
  }
  const std::set<std::string> gpus(plan.daemons.devices.begin(), plan.daemons.devices.end());
  const double line_rate = Median(single_runs) * static_cast<double>(gpus.size());
  const double ratio = Median(tierd_runs) / line_rate;
  const uint64_t disk_during = disk_read() - disk_before;
  Progress(absl::StrFormat(
      "%s warm: all ranks %.2f GB/s = %.3f of %zu GPU(s) x one GPU's copy rate (goal >= 0.90); "
      "read from disk meanwhile: %s",
      label, Median(tierd_runs), ratio, gpus.size(), FormatByteSize(disk_during)));
  return {{"repeat", plan.repeat},
          {"gpus", gpus.size()},
          {"reference",
           "one client alone: its GPU's copies of the model's bytes from a pinned POSIX "
           "shared-memory buffer, object by object on one stream"},
          {"tierd_gb_per_s", tierd_runs},
          {"single_gpu_copy_gb_per_s", single_runs},
          {"tierd_median_gb_per_s", Median(tierd_runs)},
          {"single_gpu_copy_median_gb_per_s", Median(single_runs)},
          {"ratio_to_gpus_times_single", ratio},
          {"goal_ratio_at_least", 0.90},
          {"disk_bytes_read_during_warm", disk_during}};
}

}  // namespace

nlohmann::json RunAlonePhase(const NodePlan& plan, NodeClients& clients) {
  Progress(absl::StrCat("alone: daemon 0 on ", plan.daemons.devices[0], ", without peers"));
  std::unique_ptr<NodeDaemons> daemons = StartWithModel(plan, 1, /*with_peers=*/false, "alone");
  const nlohmann::json connected = ConnectClients(plan, clients, *daemons)[0];
  nlohmann::json result = MakeCold(plan);
  const nlohmann::json load = clients.Ask({0}, {{"op", "load"}})[0];
  const Round round = Summarize({load});
  const tierd::v1::Stats stats = Check(daemons->client(0).GetStats(), "alone: stats");
  Disconnect(clients, 1);
  const std::vector<std::string> ends = daemons->Stop();
  Progress(absl::StrFormat("alone: %.3f GB/s (%s in %.2f s)", round.gb_per_s[0],
                           FormatByteSize(connected["bytes"].get<uint64_t>()), round.span_s));
  result.update({{"device", plan.daemons.devices[0]},
                 {"seconds", round.span_s},
                 {"bytes_fetched", round.bytes[0]},
                 {"gb_per_s", round.gb_per_s[0]},
                 {"stats", DaemonFigures(stats)},
                 {"daemon_end", ends[0]}});
  return result;
}

nlohmann::json RunTogetherPhase(const NodePlan& plan, NodeClients& clients, double alone_gb_per_s,
                                std::unique_ptr<NodeDaemons>& daemons) {
  const int count = plan.daemon_count();
  Progress(absl::StrCat("together: ", count, " daemons, each other's peers"));
  if (daemons != nullptr) {  // an earlier run's, whose sockets the new daemons take
    Disconnect(clients, daemons->count());
    daemons.reset();
  }
  daemons = StartWithModel(plan, count, /*with_peers=*/true, "together");
  const std::vector<nlohmann::json> connected = ConnectClients(plan, clients, *daemons);
  const uint64_t model_bytes = connected[0]["bytes"].get<uint64_t>();
  nlohmann::json result = MakeCold(plan);
  const Round round = Summarize(clients.Ask(FirstWorkers(count), {{"op", "load"}}));

  // Per daemon, and per GPU: the daemons sharing a device share its link.
  nlohmann::json per_daemon = nlohmann::json::array();
  uint64_t disk_bytes = 0, host_bytes = 0;
  // The goal is per daemon: each stands for a GPU (one daemon per GPU on a node), also where
  // several share one GPU here.
  double worst_daemon_ratio = 0;
  std::map<std::string, std::vector<int>> by_device;
  for (int i = 0; i < count; ++i) {
    const tierd::v1::Stats stats =
        Check(daemons->client(i).GetStats(), absl::StrCat("together: stats of daemon ", i));
    nlohmann::json figures = DaemonFigures(stats);
    figures.update({{"daemon", i},
                    {"on", plan.daemons.devices[i]},
                    {"gb_per_s", round.gb_per_s[i]},
                    {"bytes_fetched", round.bytes[i]},
                    {"ratio_to_alone", round.gb_per_s[i] / alone_gb_per_s}});
    disk_bytes += stats.bytes_disk_to_host();
    host_bytes += stats.host().used_bytes();
    const double daemon_ratio = round.gb_per_s[i] / alone_gb_per_s;
    worst_daemon_ratio = i == 0 ? daemon_ratio : std::min(worst_daemon_ratio, daemon_ratio);
    by_device[plan.daemons.devices[i]].push_back(i);
    per_daemon.push_back(std::move(figures));
    Progress(absl::StrFormat(
        "together: daemon %d on %s: %.3f GB/s; disk→host %s, host used %s, from a home %llu "
        "objects (%s), fallbacks %llu",
        i, plan.daemons.devices[i], round.gb_per_s[i], FormatByteSize(stats.bytes_disk_to_host()),
        FormatByteSize(stats.host().used_bytes()),
        static_cast<unsigned long long>(stats.node_host_fetches()),
        FormatByteSize(stats.bytes_node_host_to_gpu()),
        static_cast<unsigned long long>(stats.node_fallbacks())));
  }
  nlohmann::json per_gpu = nlohmann::json::array();
  double worst_gpu_ratio = 0;
  for (const auto& [device, indices] : by_device) {
    // The device's throughput: its daemons' bytes from the first one's start to the last one's end.
    double first_start = round.start_s[indices[0]], last_end = round.end_s[indices[0]];
    for (int i : indices) {
      first_start = std::min(first_start, round.start_s[i]);
      last_end = std::max(last_end, round.end_s[i]);
    }
    const double gb_per_s =
        static_cast<double>(indices.size() * model_bytes) / 1e9 / (last_end - first_start);
    const double ratio = gb_per_s / alone_gb_per_s;
    worst_gpu_ratio = per_gpu.empty() ? ratio : std::min(worst_gpu_ratio, ratio);
    per_gpu.push_back({{"device", device},
                       {"daemons", indices},
                       {"gb_per_s", gb_per_s},
                       {"ratio_to_alone", ratio}});
  }
  result.update({{"model_bytes", model_bytes},
                 {"daemons", per_daemon},
                 {"devices", per_gpu},
                 {"span_s", round.span_s},
                 {"aggregate_gb_per_s", round.aggregate_gb_per_s},
                 {"disk_bytes", disk_bytes},
                 {"host_bytes", host_bytes},
                 {"disk_bytes_over_model", static_cast<double>(disk_bytes) / model_bytes},
                 {"host_bytes_over_model", static_cast<double>(host_bytes) / model_bytes},
                 {"worst_device_ratio_to_alone", worst_gpu_ratio},
                 {"worst_daemon_ratio_to_alone", worst_daemon_ratio},
                 {"goals",
                  {{"disk_bytes_over_model", 1.0},
                   {"host_bytes_over_model", 1.0},
                   {"daemon_ratio_to_alone_at_least", 0.90}}}});
  Progress(absl::StrFormat(
      "together: node %.3f GB/s; disk bytes / model %.2f, host bytes / model %.2f (goals 1.0); "
      "worst daemon / alone %.3f (goal >= 0.90), worst device / alone %.3f",
      round.aggregate_gb_per_s, result["disk_bytes_over_model"].get<double>(),
      result["host_bytes_over_model"].get<double>(), worst_daemon_ratio, worst_gpu_ratio));
  return result;
}

nlohmann::json RunWarmPhase(const NodePlan& plan, NodeClients& clients, NodeDaemons& daemons) {
  const int count = daemons.count();
  const std::vector<int> all = FirstWorkers(count);
  uint64_t disk_before = 0;
  for (int i = 0; i < count; ++i) {
    disk_before += Check(daemons.client(i).GetStats(), "warm: stats").bytes_disk_to_host();
  }
  // One buffer of the model's size, which every client process maps and registers.
  const uint64_t model_bytes = TotalBytes(RegisteredObjects(daemons.client(0), plan.model, ""));
  const std::unique_ptr<tierd::SharedMemory> shared =
      MapReference(clients, all, model_bytes, "node-bench-reference", "warm");

  std::vector<double> tierd_runs, reference_runs;
  nlohmann::json per_daemon_runs = nlohmann::json::array();
  for (int run = 0; run < plan.repeat; ++run) {
    clients.Ask(all, {{"op", "evict_gpu"}});
    const Round fetched = Summarize(clients.Ask(all, {{"op", "load"}}));
    const Round copied = Summarize(clients.Ask(all, {{"op", "copy_reference"}}));
    tierd_runs.push_back(fetched.aggregate_gb_per_s);
    reference_runs.push_back(copied.aggregate_gb_per_s);
    per_daemon_runs.push_back(
        {{"tierd_gb_per_s", fetched.gb_per_s}, {"reference_gb_per_s", copied.gb_per_s}});
    Progress(absl::StrFormat("warm run %d: tierd %.2f GB/s, reference %.2f GB/s (all %d at once)",
                             run, tierd_runs.back(), reference_runs.back(), count));
  }
  Disconnect(clients, count);
  nlohmann::json after = nlohmann::json::array();
  uint64_t disk_after = 0;
  for (int i = 0; i < count; ++i) {
    const tierd::v1::Stats stats = Check(daemons.client(i).GetStats(), "warm: stats");
    disk_after += stats.bytes_disk_to_host();
    after.push_back(DaemonFigures(stats));
  }
  const double ratio = Median(tierd_runs) / Median(reference_runs);
  Progress(absl::StrFormat("warm: tierd %.2f GB/s, reference %.2f GB/s, ratio %.3f (goal >= 0.90)",
                           Median(tierd_runs), Median(reference_runs), ratio));
  return {{"repeat", plan.repeat},
          {"model_bytes", model_bytes},
          {"bytes_per_run", model_bytes * count},
          {"reference",
           plan.cuda ? "cudaMemcpyAsync from ONE POSIX shared-memory buffer of the model's size, "
                       "mapped and cudaHostRegister'ed by each client process, to a device buffer "
                       "of that process, object by object on one stream, all processes at once, "
                       "after one untimed round"
                     : "memcpy (the host backend's copy; no CUDA) from ONE POSIX shared-memory "
                       "buffer of the model's size, mapped by each client process, object by "
                       "object, all processes at once, after one untimed round"},
          {"tierd_gb_per_s", tierd_runs},
          {"reference_gb_per_s", reference_runs},
          {"per_daemon_runs", per_daemon_runs},
          {"tierd_median_gb_per_s", Median(tierd_runs)},
          {"reference_median_gb_per_s", Median(reference_runs)},
          {"ratio", ratio},
          {"goal_ratio_at_least", 0.90},
          {"disk_bytes_during_warm", disk_after - disk_before},
          {"stats_after", after}};
}

nlohmann::json RunTensorParallelPhase(const NodePlan& plan, NodeClients& clients, uint32_t dim,
                                      double alone_seconds) {
  const int count = plan.daemon_count();
  const std::string label = absl::StrCat("tp_dim", dim);
  Progress(absl::StrCat(label, ": ", count,
                        " ranks, one per daemon, each loading its shards along "
                        "dimension ",
                        dim));
  std::unique_ptr<NodeDaemons> daemons = StartWithModel(plan, count, /*with_peers=*/true, label);
  const uint64_t model_bytes = ConnectClients(plan, clients, *daemons)[0]["bytes"].get<uint64_t>();
  nlohmann::json result = MakeCold(plan);
  const std::optional<uint64_t> device_before = DeviceBytesRead(plan.model_dir);
  std::vector<nlohmann::json> requests;
  for (int rank = 0; rank < count; ++rank) {
    requests.push_back(
        {{"op", "load"}, {"shard", {{"dim", dim}, {"index", rank}, {"count", count}}}});
  }
  const Round round = Summarize(clients.AskEach(FirstWorkers(count), requests));
  const std::optional<uint64_t> device_after = DeviceBytesRead(plan.model_dir);
  const double goal_seconds = alone_seconds / count * 1.10;
  nlohmann::json ranks = nlohmann::json::array();
  uint64_t disk_bytes = 0, disk_bytes_read = 0, shard_bytes = 0;
  double worst_seconds = 0;
  for (int rank = 0; rank < count; ++rank) {
    const tierd::v1::Stats stats =
        Check(daemons->client(rank).GetStats(), absl::StrCat(label, ": stats of daemon ", rank));
    const double seconds = round.end_s[rank] - round.start_s[rank];
    worst_seconds = std::max(worst_seconds, seconds);
    disk_bytes += stats.bytes_disk_to_host();
    disk_bytes_read += stats.disk_bytes_read();
    shard_bytes += round.bytes[rank];
    nlohmann::json figures = DaemonFigures(stats);
    figures.update({{"rank", rank},
                    {"on", plan.daemons.devices[rank]},
                    {"seconds", seconds},
                    {"bytes_fetched", round.bytes[rank]},
                    {"gb_per_s", round.gb_per_s[rank]},
                    {"seconds_over_alone_per_rank", seconds / (alone_seconds / count)}});
    ranks.push_back(std::move(figures));
    Progress(absl::StrFormat("%s: rank %d: %s in %.3f s (%.3f GB/s), %.3f of alone / %d", label,
                             rank, FormatByteSize(round.bytes[rank]), seconds, round.gb_per_s[rank],
                             seconds / (alone_seconds / count), count));
  }
  nlohmann::json warm =
      RunWarmTensorParallel(plan, clients, *daemons, requests, model_bytes, label);
  Disconnect(clients, count);
  const std::vector<std::string> ends = daemons->Stop();
  const double disk_over_model = static_cast<double>(disk_bytes) / model_bytes;
  const double read_over_model = static_cast<double>(disk_bytes_read) / model_bytes;
  // What the device itself served (every reader of it, page cache misses only), where it is known.
  nlohmann::json device_over_model = nullptr;
  if (device_before.has_value() && device_after.has_value()) {
    device_over_model = static_cast<double>(*device_after - *device_before) / model_bytes;
    result["device_bytes_read"] = *device_after - *device_before;
  }
  Progress(absl::StrFormat(
      "%s: node read %.3f of the model from disk (%.3f with the reads' rounding to blocks, %s "
      "from the device; goal 1.0); slowest rank %.3f s, goal <= %.3f s (alone / %d + 10%%)",
      label, disk_over_model, read_over_model, FormatRatio(device_over_model), worst_seconds,
      goal_seconds, count));
  result.update(
      {{"dim", dim},
       {"ranks", ranks},
       {"model_bytes", model_bytes},
       {"shard_bytes", shard_bytes},
       {"disk_bytes", disk_bytes},
       {"disk_bytes_over_model", disk_over_model},
       {"disk_bytes_read", disk_bytes_read},
       {"disk_bytes_read_over_model", read_over_model},
       {"device_bytes_read_over_model", device_over_model},
       {"span_s", round.span_s},
       {"aggregate_gb_per_s", round.aggregate_gb_per_s},
       {"worst_rank_seconds", worst_seconds},
       {"alone_seconds", alone_seconds},
       {"goal_rank_seconds_at_most", goal_seconds},
       {"goals", {{"disk_bytes_over_model", 1.0}, {"rank_seconds_over_alone_per_rank", 1.10}}},
       {"warm", std::move(warm)},
       {"daemon_ends", ends}});
  return result;
}

nlohmann::json MedianRun(const std::vector<nlohmann::json>& runs, const std::string& figure) {
  std::vector<double> figures;
  for (const nlohmann::json& run : runs) figures.push_back(run[figure].get<double>());
  const double median = Median(figures);
  nlohmann::json result;
  for (const nlohmann::json& run : runs) {
    if (run[figure].get<double>() == median) {
      result = run;
      break;
    }
  }
  result["runs_" + figure] = figures;
  return result;
}

}  // namespace tierd::bench
