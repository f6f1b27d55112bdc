// node_bench: N daemons of one node loading the same model, as a node's model servers do when they
// start together (docs/BENCHMARKS.md, "The node: N daemons, one model").
//
//   node_bench --tierd=PATH --model-dir=DIR [--daemons=2] [--gpus=0,1] [--backend=cuda|host]
//              [--tensors=64MiBx128 --files=4] [--repeat=3] [--json=OUT]
//
// Starts the daemons itself (daemon i on GPU gpus[i % len], several per GPU allowed; each with its
// own socket, state directory and log under --work-dir) and forks one client process per daemon
// before it creates any gRPC channel or device. Writes the model (gpu_path_bench's make-model) into
// --model-dir when that holds nothing, and registers it with every daemon. Then, in one run:
//   alone     daemon 0 by itself (no --peers), fresh, cold-loads the model to its GPU;
//   together  all daemons fresh, each other's --peers, cold-load the model at the same moment;
//   warm      the model in host memory, evicted from the GPUs: all fetch it at once, --repeat
//   times,
//             against plain copies of the same bytes from one shared pinned buffer;
//   tp        (only when --phases names it) tensor parallelism, one rank per daemon: all fresh,
//             each other's peers, every rank cold-loads its shard of every tensor at once, along
//             dimension 0 and then 1 (docs/SHARDS.md), then again warm from the host tier.
// Prints progress on stderr and a table on stdout, and writes every figure to --json.
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_support.h"
#include "bench/model_writer.h"
#include "bench/node_phases.h"
#include "bench/node_report.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "common/machine.h"
#include "device/shared_memory.h"

ABSL_FLAG(std::string, tierd, "", "The tierd binary to start the daemons from");
ABSL_FLAG(int, daemons, 2, "Daemons of the node, each with its own client process");
ABSL_FLAG(std::string, gpus, "0", "CUDA ordinals, comma-separated: daemon i runs on gpus[i % len]");
ABSL_FLAG(std::string, backend, "cuda", "cuda, or host (no GPU: a smoke run; --gpus is ignored)");
ABSL_FLAG(std::string, model, "node", "Name to register the model under");
ABSL_FLAG(
    std::string, model_dir, "",
    "Directory of the model; written (random bytes) when missing or empty. Put it on the disk "
    "models live on, or on tmpfs for the host-memory path alone");
ABSL_FLAG(std::string, tensors, "64MiBx128", "The model's tensors, SIZExCOUNT,... (8 GiB)");
ABSL_FLAG(int, files, 4, "Files to spread the model's tensors over");
ABSL_FLAG(std::string, work_dir, "/tmp/tierd-node-bench",
          "The daemons' sockets, state directories and logs (daemon-I/PHASE.log)");
ABSL_FLAG(tierd::ByteSize, host_cache_bytes, tierd::ByteSize{0},
          "Each daemon's --host-cache-bytes; 0: the model's size and an eighth");
ABSL_FLAG(tierd::ByteSize, gpu_pool_bytes, tierd::ByteSize{0},
          "Each daemon's --gpu-pool-bytes; 0: the model's size and an eighth");
ABSL_FLAG(std::string, tierd_flags, "", "More flags for every daemon, space-separated");
ABSL_FLAG(int, repeat, 3, "warm: timed rounds of each side");
ABSL_FLAG(int, cold_repeat, 1,
          "Runs of each cold phase (alone, together), fresh daemons each time; the median run is "
          "reported, with every run's figure");
ABSL_FLAG(bool, drop_caches, true,
          "Drop the page cache before each cold load (needs root; pointless on tmpfs)");
ABSL_FLAG(double, timeout, 600, "Seconds any one step (a daemon's start, a load) may take");
ABSL_FLAG(std::string, json, "", "Write every figure here as JSON");
ABSL_FLAG(std::string, phases, "alone,together,warm",
          "Phases to run, of alone, together, warm and tp (warm needs together; together and tp "
          "need alone)");
ABSL_FLAG(uint64_t, row_bytes, 8192,
          "A written model's tensors are [size / this, this] U8 (a 4096-wide BF16 layer's rows): "
          "the tp phase splits them along each dimension");

namespace tierd::bench {
namespace {

constexpr char kModelStamp[] = ".node-bench-model";

// Writes the model unless `dir` holds the one these flags name; refuses a directory holding
// anything else, so that no one's files are overwritten.
void EnsureModel(const std::string& dir, const std::string& tensors, int files,
                 uint64_t row_bytes) {
  const std::string want =
      row_bytes == 0 ? absl::StrCat(tensors, " in ", files, " files\n")
                     : absl::StrCat(tensors, " in ", files, " files, rows of ", row_bytes, "\n");
  std::ifstream stamp_in(dir + "/" + kModelStamp);
  const std::string have((std::istreambuf_iterator<char>(stamp_in)),
                         std::istreambuf_iterator<char>());
  if (have == want) return;
  std::error_code error;
  if (std::filesystem::exists(dir, error) && !std::filesystem::is_empty(dir, error)) {
    Die(absl::StrCat(
        "--model-dir ", dir, " holds no model this benchmark wrote with --tensors=", tensors,
        " --files=", files, " --row-bytes=", row_bytes, "; remove it or name another"));
  }
  WriteModel(dir, ParseTensorList(tensors), files, row_bytes);
  std::ofstream(dir + "/" + kModelStamp) << want;
}

bool OnTmpfs(const std::string& path) {
  struct statfs fs = {};
  return ::statfs(path.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

std::vector<std::string> DaemonDevices(int count) {
  std::vector<std::string> gpus;
  if (absl::GetFlag(FLAGS_backend) == "host") {
    gpus.push_back("host");
  } else if (absl::GetFlag(FLAGS_backend) == "cuda") {
    for (absl::string_view gpu :
         absl::StrSplit(absl::GetFlag(FLAGS_gpus), ',', absl::SkipEmpty())) {
      int ordinal = 0;
      if (!absl::SimpleAtoi(gpu, &ordinal) || ordinal < 0) {
        Die(absl::StrCat("--gpus: \"", gpu, "\" is no CUDA ordinal"));
      }
      gpus.push_back(absl::StrCat("cuda:", ordinal));
    }
    if (gpus.empty()) Die("--gpus names no GPU");
  } else {
    Die("--backend must be cuda or host");
  }
  std::vector<std::string> devices;
  for (int i = 0; i < count; ++i) devices.push_back(gpus[i % gpus.size()]);
  return devices;
}

// Refuses a run whose host caches and reference buffer would not fit in the memory available.
void CheckMemory(const NodePlan& plan, uint64_t model_bytes) {
  const uint64_t needed = plan.daemon_count() * plan.daemons.host_cache_bytes + model_bytes;
  const uint64_t available = Check(AvailableMemoryBytes(), "reading MemAvailable");
  if (needed > available / 10 * 9) {
    Die(absl::StrCat(plan.daemon_count(), " host caches of ",
                     FormatByteSize(plan.daemons.host_cache_bytes), " and a reference buffer of ",
                     FormatByteSize(model_bytes), " need ", FormatByteSize(needed), "; only ",
                     FormatByteSize(available), " are available"));
  }
  const uint64_t shm_free = Check(SharedMemoryFreeBytes(), "free space of /dev/shm");
  if (model_bytes > shm_free) {
    Die(absl::StrCat("the reference buffer (", FormatByteSize(model_bytes),
                     ") does not fit in "
                     "/dev/shm (",
                     FormatByteSize(shm_free), " free)"));
  }
}

nlohmann::json Machine(const nlohmann::json& phases) {
  struct utsname names = {};
  ::uname(&names);
  std::set<std::string> devices;
  if (phases.contains("together")) {
    for (const nlohmann::json& daemon : phases["together"]["daemons"]) {
      devices.insert(daemon["device"].get<std::string>());
    }
  }
  return {{"nproc", UsableCpus()},
          {"online_cpus", ::sysconf(_SC_NPROCESSORS_ONLN)},
          {"memory_bytes", static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                               static_cast<uint64_t>(::sysconf(_SC_PAGESIZE))},
          {"kernel", names.release},
          {"hostname", names.nodename},
          {"devices", devices}};
}

int Main(int argc, char** argv) {
  // As tierd and load_bench do: Debian's Abseil tracks every lock's order under one process-wide
  // lock, which the client processes would measure instead of the sessions.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "node_bench --tierd=PATH --model-dir=DIR [--daemons=N] [--gpus=0,1,...] "
      "[--backend=cuda|host] [--phases=alone,together,warm,tp] "
      "[--json=OUT]");
  if (absl::StatusOr<std::vector<std::string>> parsed =
          tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
      !parsed.ok()) {
    std::fprintf(stderr, "node_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) absl::StrAppend(&command, i == 0 ? "" : " ", argv[i]);
  const int count = absl::GetFlag(FLAGS_daemons);
  if (count < 1) Die("--daemons must be at least 1");
  if (absl::GetFlag(FLAGS_repeat) < 1 || absl::GetFlag(FLAGS_cold_repeat) < 1) {
    Die("--repeat and --cold-repeat must be at least 1");
  }
  const std::set<std::string> wanted = absl::StrSplit(absl::GetFlag(FLAGS_phases), ',');
  for (const std::string& phase : wanted) {
    if (phase != "alone" && phase != "together" && phase != "warm" && phase != "tp") {
      Die(absl::StrCat("--phases: \"", phase, "\" is none of alone, together, warm, tp"));
    }
  }
  if (wanted.count("warm") > 0 && wanted.count("together") == 0)
    Die("--phases: warm needs together");
  NodePlan plan;
  plan.daemons.tierd = absl::GetFlag(FLAGS_tierd);
  if (plan.daemons.tierd.empty() || ::access(plan.daemons.tierd.c_str(), X_OK) != 0) {
    Die("--tierd must name the tierd binary");
  }
  plan.daemons.tierd = std::filesystem::absolute(plan.daemons.tierd);
  plan.daemons.devices = DaemonDevices(count);
  plan.cuda = absl::GetFlag(FLAGS_backend) == "cuda";
  plan.model = absl::GetFlag(FLAGS_model);
  plan.model_dir = absl::GetFlag(FLAGS_model_dir);
  if (plan.model_dir.empty()) Die("--model-dir is required");
  plan.model_dir = std::filesystem::absolute(plan.model_dir);
  plan.daemons.model_root = plan.model_dir;
  plan.daemons.work_dir = std::filesystem::absolute(absl::GetFlag(FLAGS_work_dir));
  plan.drop_caches = absl::GetFlag(FLAGS_drop_caches);
  plan.repeat = absl::GetFlag(FLAGS_repeat);
  plan.cold_repeat = absl::GetFlag(FLAGS_cold_repeat);
  plan.daemons.start_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout));
  for (absl::string_view flag :
       absl::StrSplit(absl::GetFlag(FLAGS_tierd_flags), ' ', absl::SkipWhitespace())) {
    plan.daemons.extra_flags.emplace_back(flag);
  }
  const std::vector<TensorSpec> tensors = ParseTensorList(absl::GetFlag(FLAGS_tensors));
  uint64_t model_bytes = 0;
  for (const TensorSpec& tensor : tensors) model_bytes += tensor.bytes;
  const uint64_t room = (model_bytes + model_bytes / 8 + (1ull << 20) - 1) >> 20 << 20;
  plan.daemons.host_cache_bytes = absl::GetFlag(FLAGS_host_cache_bytes).bytes;
  if (plan.daemons.host_cache_bytes == 0) plan.daemons.host_cache_bytes = room;
  plan.daemons.gpu_pool_bytes = absl::GetFlag(FLAGS_gpu_pool_bytes).bytes;
  if (plan.daemons.gpu_pool_bytes == 0) plan.daemons.gpu_pool_bytes = room;
  CheckMemory(plan, model_bytes);

  EnsureModel(plan.model_dir, absl::GetFlag(FLAGS_tensors), absl::GetFlag(FLAGS_files),
              absl::GetFlag(FLAGS_row_bytes));
  plan.model_on_tmpfs = OnTmpfs(plan.model_dir);
  if (plan.model_on_tmpfs) {
    Progress("the model is on tmpfs: no page cache to drop; cold means not in a host cache");
  }

  nlohmann::json phases;
  {
    // The client processes first: nothing of gRPC or a device may exist in a process that forks.
    NodeClients clients(count, absl::Seconds(absl::GetFlag(FLAGS_timeout)));
    std::vector<nlohmann::json> runs;
    for (int run = 0; run < plan.cold_repeat; ++run) runs.push_back(RunAlonePhase(plan, clients));
    phases["alone"] = MedianRun(runs, "gb_per_s");
    const double alone = phases["alone"]["gb_per_s"].get<double>();
    if (wanted.count("together") > 0) {
      runs.clear();
      std::unique_ptr<NodeDaemons> daemons;
      for (int run = 0; run < plan.cold_repeat; ++run) {
        runs.push_back(RunTogetherPhase(plan, clients, alone, daemons));
      }
      phases["together"] = MedianRun(runs, "aggregate_gb_per_s");
      if (wanted.count("warm") > 0) phases["warm"] = RunWarmPhase(plan, clients, *daemons);
      phases["together"]["daemon_ends"] = daemons->Stop();
    }
    if (wanted.count("tp") > 0) {
      const double alone_seconds = phases["alone"]["seconds"].get<double>();
      for (uint32_t dim : {0u, 1u}) {
        runs.clear();
        for (int run = 0; run < plan.cold_repeat; ++run) {
          runs.push_back(RunTensorParallelPhase(plan, clients, dim, alone_seconds));
        }
        nlohmann::json median = MedianRun(runs, "aggregate_gb_per_s");
        phases[absl::StrCat("tp_dim", dim)] = std::move(median);
      }
      phases["tp_dim1"]["throughput_over_dim0"] =
          phases["tp_dim1"]["aggregate_gb_per_s"].get<double>() /
          phases["tp_dim0"]["aggregate_gb_per_s"].get<double>();
      phases["tp_dim1"]["goal_throughput_over_dim0_at_least"] = 0.8;
    }
  }

  nlohmann::json result = {{"benchmark", "node"},
                           {"date", TodayUtc()},
                           {"command", command},
                           {"machine", Machine(phases)},
                           {"model",
                            {{"name", plan.model},
                             {"dir", plan.model_dir},
                             {"tensors", absl::GetFlag(FLAGS_tensors)},
                             {"files", absl::GetFlag(FLAGS_files)},
                             {"objects", tensors.size()},
                             {"bytes", model_bytes},
                             {"on_tmpfs", plan.model_on_tmpfs}}},
                           {"daemons",
                            {{"count", count},
                             {"devices", plan.daemons.devices},
                             {"host_cache_bytes", plan.daemons.host_cache_bytes},
                             {"gpu_pool_bytes", plan.daemons.gpu_pool_bytes},
                             {"extra_flags", plan.daemons.extra_flags},
                             {"work_dir", plan.daemons.work_dir}}},
                           {"phases", phases}};
  std::printf("%s", FormatNodeReport(result).c_str());
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) {
    std::ofstream out(json);
    out << result.dump(2) << "\n";
    if (!out) Die("cannot write " + json);
  }
  return 0;
}

}  // namespace
}  // namespace tierd::bench

int main(int argc, char** argv) { return tierd::bench::Main(argc, argv); }
