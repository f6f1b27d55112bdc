#include "bench/host_load.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_support.h"
#include "bench/host_load_model.h"
#include "bench/host_load_runs.h"
#include "common/byte_size.h"
#include "common/machine.h"
#include "device/device_factory.h"

namespace tierd::bench {
namespace {

// A state directory for the stacks, removed when this goes.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    const char* tmp = ::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tierd-host-load-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) Die("cannot create " + pattern);
    path_ = pattern;
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

nlohmann::json ModelRecord(const HostLoadModel& model) {
  nlohmann::json files = nlohmann::json::array();
  std::vector<size_t> objects_per_file(model.files.size());
  for (const HostLoadObject& object : model.objects) ++objects_per_file[object.file];
  for (size_t f = 0; f < model.files.size(); ++f) {
    files.push_back({{"path", model.files[f].path},
                     {"bytes", model.files[f].bytes},
                     {"objects", objects_per_file[f]}});
  }
  return {{"directory", model.directory},
          {"object_bytes_total", model.object_bytes},
          {"file_bytes_total", model.file_bytes},
          {"objects", model.objects.size()},
          {"largest_object_bytes", model.objects.front().bytes},
          {"grouping", "block (one tensor per object)"},
          {"files", files}};
}

}  // namespace

nlohmann::json RunHostLoad(const HostLoadOptions& options) {
  if (options.model_dir.empty()) Die("--model-dir is required in host-load mode");
  if (options.model_bytes == 0 || options.object_bytes == 0 || options.shard_bytes == 0) {
    Die("--model-bytes, --object-bytes and --shard-bytes must be positive");
  }
  if (options.reference_threads.empty()) Die("--reference-threads names no thread count");
  if (options.repeat < 1) Die("--repeat must be at least 1");
  const uint64_t available = Check(AvailableMemoryBytes(), "reading the memory available");
  if (options.model_bytes > available / 2) {
    Die(absl::StrCat("--model-bytes=", FormatByteSize(options.model_bytes),
                     " is more than half of the memory available (MemAvailable ",
                     FormatByteSize(available),
                     "): each side pins an arena the model's size, and a model on tmpfs is in "
                     "memory too"));
  }
  // Models are registered from absolute paths only.
  std::string model_dir = std::filesystem::absolute(options.model_dir).lexically_normal().string();
  while (model_dir.size() > 1 && model_dir.back() == '/') model_dir.pop_back();
  const HostLoadModel model =
      PlanHostLoadModel(model_dir, options.model_bytes, options.object_bytes, options.shard_bytes);
  EnsureHostLoadModel(model);

  const DeviceSpec spec = Check(ParseDeviceSpec(options.device), "--device");
  std::unique_ptr<Device> device = Check(CreateDevice(spec), "creating the device");
  const ScratchDirectory state;
  TierdLoadSettings settings;
  settings.state_dir = state.path();
  settings.reader_threads = options.reader_threads;
  settings.reader_queue_depth = options.reader_queue_depth;
  settings.reader_chunk_bytes = options.reader_chunk_bytes;
  settings.reader_engine = options.reader_engine;
  settings.checksum_threads = options.checksum_threads;
  settings.prefetch = options.prefetch;
  settings.verify_threads = std::clamp(UsableCpus(), 1, 8);

  std::vector<double> tierd_runs;
  std::vector<std::string> checksums;  // per tierd run: "recorded" or "verified"
  std::vector<std::vector<double>> reference_runs(options.reference_threads.size());
  TierdLoadResult last;
  for (int run = 0; run < options.repeat; ++run) {
    last = LoadThroughTierd(*device, model, settings);
    tierd_runs.push_back(last.gb_per_s);
    checksums.push_back(last.recorded_checksums ? "recorded" : "verified");
    std::string line = absl::StrFormat("run %d: tierd %.2f GB/s (checksums %s)", run, last.gb_per_s,
                                       checksums.back());
    for (size_t r = 0; r < options.reference_threads.size(); ++r) {
      const int threads = options.reference_threads[r];
      const PreadLoadResult reference =
          LoadWithPread(*device, model, threads, settings.verify_threads);
      reference_runs[r].push_back(reference.gb_per_s);
      absl::StrAppendFormat(&line, ", pread x%d %.2f GB/s", threads, reference.gb_per_s);
    }
    Progress(line + "; every object's bytes checked against the files");
  }

  const double tierd_median = Median(tierd_runs);
  nlohmann::json references = nlohmann::json::array();
  std::string table = absl::StrFormat(
      "host-load: %s in %d objects of up to %s, %d files, %s\n"
      "tierd: StorageStack on %s, reader %d threads x queue depth %d (%s), %s, %s; %s\n"
      "tierd's runs include the checksum the host cache computes on every read: the first run\n"
      "records the checksums, later runs verify them.\n\n",
      FormatByteSize(model.object_bytes), model.objects.size(),
      FormatByteSize(model.objects.front().bytes), model.files.size(), model.directory,
      device->Describe(), last.reader.threads, last.reader.queue_depth,
      options.reader_threads ? "set by flags"
                             : absl::StrCat("auto: ", last.reader_sizing).c_str(),
      IoEngineName(last.reader_stats.engine),
      absl::StrCat(last.reader_stats.memory_files, " of ", model.files.size(),
                   " files read from memory, ", last.reader_stats.buffered_files, " buffered"),
      options.prefetch ? "prefetch all, then fetch" : "fetch all on demand");
  absl::StrAppendFormat(&table, "%-24s %12s %12s %8s\n", "", "runs GB/s", "median GB/s", "ratio");
  absl::StrAppendFormat(
      &table, "%-24s %12s %12.2f\n", "tierd HostCache",
      absl::StrJoin(tierd_runs, " ",
                    [](std::string* out, double v) { absl::StrAppendFormat(out, "%.2f", v); }),
      tierd_median);
  for (size_t r = 0; r < options.reference_threads.size(); ++r) {
    const double median = Median(reference_runs[r]);
    const double ratio = tierd_median / median;
    references.push_back({{"threads", options.reference_threads[r]},
                          {"gb_per_s", reference_runs[r]},
                          {"median_gb_per_s", median},
                          {"ratio", ratio}});
    absl::StrAppendFormat(
        &table, "%-24s %12s %12.2f %8.3f\n",
        absl::StrCat("pread, ", options.reference_threads[r],
                     options.reference_threads[r] == 1 ? " thread" : " threads"),
        absl::StrJoin(reference_runs[r], " ",
                      [](std::string* out, double v) { absl::StrAppendFormat(out, "%.2f", v); }),
        median, ratio);
  }
  std::printf("%s", table.c_str());

  return {
      {"benchmark", "disk_read"},
      {"mode", "host-load"},
      {"command", options.command_line},
      {"date", TodayUtc()},
      {"device", device->Describe()},
      {"model", ModelRecord(model)},
      {"reader",
       {{"threads", last.reader.threads},
        {"queue_depth", last.reader.queue_depth},
        {"chunk_bytes", last.reader.chunk_bytes},
        {"defaults", !options.reader_threads && !options.reader_queue_depth &&
                         !options.reader_chunk_bytes &&
                         options.reader_engine == IoEngine::kAuto},
        {"checksum_threads", options.checksum_threads > 0 ? options.checksum_threads
                                                          : DefaultChecksumThreads()},
        {"sizing", last.reader_sizing},
        {"engine", IoEngineName(last.reader_stats.engine)},
        {"buffered_files", last.reader_stats.buffered_files},
        {"memory_files", last.reader_stats.memory_files}}},
      {"load", options.prefetch ? "prefetch" : "fetch"},
      {"tierd",
       {{"gb_per_s", tierd_runs},
        {"median_gb_per_s", tierd_median},
        {"bytes", model.object_bytes},
        {"checksums", checksums},
        {"note",
         "timed from the first submit until every object is resident, the host cache's checksum of "
         "every read included (the first run records the checksums, later runs verify them)"}}},
      {"reference",
       {{"what",
         "T threads pread the model's files (a contiguous share each, 4 MiB reads) into "
         "one pinned HostArena allocation"},
        {"bytes", model.file_bytes},
        {"runs", references}}},
      {"verified_objects_per_run", model.objects.size()},
  };
}

}  // namespace tierd::bench
