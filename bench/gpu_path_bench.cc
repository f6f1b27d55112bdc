// gpu_path_bench: tierd's data path, through a running daemon and the C++ client, measured against
// what the hardware does with the same bytes in the same run.
//
//   gpu_path_bench --mode=make-model --model-dir=DIR --tensors=16MiBx64,700MiBx2 [--files=N]
//   gpu_path_bench --mode=warm|cold|duplex|latency --socket=SOCK --model=NAME --model-dir=DIR
//                  [--repeat=N] [--json=OUT]
//
// Modes (each reports medians over --repeat runs, baseline and tierd alternating):
//   warm     host cache → GPU staging: fetch every object of one size class (evicted from the GPU
//            first, resident in the host cache) and wait for the bytes, against cudaMemcpyAsync of
//            the same sizes from pinned memory on one stream. Target ≥ 0.95.
//   cold     disk → GPU with the page cache dropped: prefetch all objects, fetch each, wait,
//            against fio reading the same files with O_DIRECT (target ≥ 0.90) and, with
//            --safetensors-script, safetensors.torch.load_file(device="cuda") cold and warm.
//   duplex   prefetch+fetch of the model (H2D) while another session stores objects (D2H) at
//            once, against two plain copies in opposite directions at once. Reference 72 GB/s.
//   latency  Fetch of an object already on the GPU through a session, --fetches times;
//            p50/p99 of the call (request sent → lease usable). Targets p50 ≤ 50 µs, p99 ≤ 200 µs.
// The model is registered with per-tensor grouping (one object per tensor) when not yet known.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/bench_support.h"
#include "client/tierd_client.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "common/directory.h"
#include "device/pinned_host_buffer.h"

ABSL_FLAG(std::string, mode, "", "make-model, warm, cold, duplex or latency");
ABSL_FLAG(std::string, socket, "/run/tierd/gpu0.sock", "The daemon's socket");
ABSL_FLAG(std::string, model, "bench", "Name to register the model under");
ABSL_FLAG(std::string, model_dir, "", "Directory of the model's .safetensors files");
ABSL_FLAG(std::string, tensors, "16MiBx64,64MiBx16,256MiBx4,700MiBx2",
          "make-model: tensor sizes, SIZExCOUNT,...");
ABSL_FLAG(int, files, 1, "make-model: files to spread the tensors over");
ABSL_FLAG(int, repeat, 5, "Timed runs of each side");
ABSL_FLAG(int, fetches, 20000, "latency: timed fetches");
ABSL_FLAG(tierd::ByteSize, store_bytes, tierd::ByteSize{256ull << 20}, "duplex: bytes per store");
ABSL_FLAG(int, stores, 16, "duplex: stores per run");
ABSL_FLAG(std::string, fio, "fio", "cold: fio binary for the O_DIRECT reference");
ABSL_FLAG(int, fio_queue_depth, 32, "cold: fio's queue depth (4 MiB reads, one job)");
ABSL_FLAG(std::string, python, "python3", "cold: Python with torch and safetensors");
ABSL_FLAG(std::string, safetensors_script, "",
          "cold: bench/safetensors_load.py, to time safetensors.torch.load_file; empty: skip");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace {

using tierd::bench::Die;
using tierd::bench::Median;
using tierd::bench::Percentile;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Die(absl::StrCat(what, ": ", value.status().ToString()));
  return *std::move(value);
}

void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

void Progress(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

// ---- make-model ---------------------------------------------------------------------------------

struct TensorSpec {
  std::string name;
  uint64_t bytes;
};

std::vector<TensorSpec> ParseTensorList(const std::string& text) {
  std::vector<TensorSpec> tensors;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, 'x');
    int count = 0;
    absl::StatusOr<uint64_t> size =
        parts.size() == 2 ? tierd::ParseByteSize(parts[0]) : absl::InvalidArgumentError("");
    if (!size.ok() || *size == 0 || !absl::SimpleAtoi(parts[1], &count) || count <= 0) {
      Die(absl::StrCat("--tensors: \"", item, "\" is not SIZExCOUNT (e.g. 64MiBx16)"));
    }
    for (int i = 0; i < count; ++i) {
      tensors.push_back({absl::StrCat("s", *size >> 20, "m.", i), *size});
    }
  }
  if (tensors.empty()) Die("--tensors names no tensor");
  return tensors;
}

// Writes one safetensors file of U8 tensors filled with pseudo-random bytes.
void WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                      uint64_t& seed) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const TensorSpec& tensor : tensors) {
    header[tensor.name] = {{"dtype", "U8"},
                           {"shape", {tensor.bytes}},
                           {"data_offsets", {offset, offset + tensor.bytes}}};
    offset += tensor.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<uint64_t> block(1 << 20);  // 8 MiB
  for (uint64_t written = 0; written < offset;) {
    for (uint64_t& word : block) {  // splitmix64
      uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      word = z ^ (z >> 31);
    }
    const uint64_t n = std::min<uint64_t>(block.size() * 8, offset - written);
    out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(n));
    written += n;
  }
  out.close();
  if (!out) Die("cannot write " + path);
}

int MakeModel() {
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) Die("--model-dir is required");
  const std::vector<TensorSpec> tensors = ParseTensorList(absl::GetFlag(FLAGS_tensors));
  const int files = std::max(1, absl::GetFlag(FLAGS_files));
  ::mkdir(dir.c_str(), 0755);
  std::vector<std::vector<TensorSpec>> per_file(files);
  for (size_t i = 0; i < tensors.size(); ++i) per_file[i % files].push_back(tensors[i]);
  uint64_t seed = 1;
  for (int f = 0; f < files; ++f) {
    const std::string path = absl::StrCat(dir, "/model-", f + 1, "-of-", files, ".safetensors");
    Progress(absl::StrCat("writing ", path));
    WriteSafetensors(path, per_file[f], seed);
  }
  ::sync();
  return 0;
}

// ---- a connected benchmark ----------------------------------------------------------------------

struct Object {
  std::string key;
  uint64_t size;
};

class Bench {
 public:
  Bench() {
    tierd::ClientOptions options;
    options.socket_path = absl::GetFlag(FLAGS_socket);
    options.client_name = "gpu_path_bench";
    options.call_timeout = absl::Minutes(10);
    client_ = Check(tierd::Client::Connect(options), "connecting");
    session_ = Check(client_->OpenSession(), "opening a session");
    stream_ = Check(device().CreateStream(tierd::StreamPriority::kHigh), "creating a stream");
    model_ = absl::GetFlag(FLAGS_model);
    objects_ = RegisteredObjects();
  }

  tierd::Client& client() { return *client_; }
  tierd::Session& session() { return *session_; }
  tierd::Device& device() { return session_->device(); }
  tierd::Stream& stream() { return *stream_; }
  const std::string& model() const { return model_; }
  const std::vector<Object>& objects() const { return objects_; }

  // The model's files, as the daemon registered them.
  std::vector<std::string> Files() const {
    std::string directory;
    for (const tierd::v1::ModelSummary& summary : Check(client_->ListModels(), "ListModels")) {
      if (summary.name() == model_) directory = summary.directory();
    }
    std::vector<std::string> files;
    for (const std::string& name : Check(tierd::ListDirectory(directory), "listing " + directory)) {
      if (absl::EndsWith(name, ".safetensors")) files.push_back(absl::StrCat(directory, "/", name));
    }
    std::sort(files.begin(), files.end());
    return files;
  }

  // Fetches `objects` on stream() and waits for their bytes; returns the seconds that took.
  // `prefetch_first` sends one prefetch of them all before the fetches, as a loader does.
  double FetchAll(const std::vector<Object>& objects, bool prefetch_first) {
    tierd::Session& session = this->session();
    tierd::Stream& stream = this->stream();
    std::vector<tierd::Lease> leases;
    leases.reserve(objects.size());
    const Clock::time_point start = Clock::now();
    if (prefetch_first) {
      std::vector<std::string> keys;
      for (const Object& object : objects) keys.push_back(object.key);
      Check(session.Prefetch(keys), "prefetch");
    }
    for (const Object& object : objects) {
      leases.push_back(Check(session.Fetch(object.key, stream), "fetch " + object.key));
    }
    Check(session.device().SynchronizeStream(stream), "synchronizing");
    const double seconds = SecondsSince(start);
    for (tierd::Lease& lease : leases) {
      if (lease.size() != ObjectSize(lease.key())) Die(lease.key() + ": lease of the wrong size");
    }
    return seconds;
  }

  // Evicts the model (or `prefix`) from `tier`, waiting for draining releases.
  void Evict(const std::string& prefix, tierd::v1::Tier tier) {
    for (int attempt = 0;; ++attempt) {
      tierd::v1::EvictResponse response = Check(session_->Evict(prefix, tier), "evict " + prefix);
      if (response.skipped() == 0) return;
      if (attempt == 5000) Die(absl::StrCat("evict ", prefix, ": objects stay busy"));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  uint64_t ObjectSize(const std::string& key) const {
    for (const Object& object : objects_) {
      if (object.key == key) return object.size;
    }
    return 0;
  }

 private:
  std::vector<Object> RegisteredObjects() {
    bool known = false;
    for (const tierd::v1::ModelSummary& summary : Check(client_->ListModels(), "ListModels")) {
      known |= summary.name() == model_;
    }
    if (!known) {
      const std::string dir = absl::GetFlag(FLAGS_model_dir);
      if (dir.empty()) Die("--model-dir is required to register " + model_);
      Progress(absl::StrCat("registering ", model_, " from ", dir));
      Check(client_->RegisterModel(model_, dir, tierd::v1::GROUPING_TENSOR), "RegisterModel");
    }
    std::vector<Object> objects;
    for (const tierd::v1::ObjectInfo& info : Check(client_->ListObjects(model_), "ListObjects")) {
      objects.push_back({info.key(), info.size()});
    }
    if (objects.empty()) Die(model_ + " has no objects");
    return objects;
  }

  std::unique_ptr<tierd::Client> client_;
  std::unique_ptr<tierd::Session> session_;
  std::unique_ptr<tierd::Stream> stream_;
  std::string model_;
  std::vector<Object> objects_;
};

nlohmann::json Environment(Bench& bench) {
  return {{"date", tierd::bench::TodayUtc()},
          {"device", bench.session().info().device()},
          {"model", bench.model()}};
}

uint64_t TotalBytes(const std::vector<Object>& objects) {
  uint64_t total = 0;
  for (const Object& object : objects) total += object.size;
  return total;
}

// Plain copies of `sizes` (bytes each) from pinned `host` memory to `device_memory` (host→device)
// or back, back to back on `stream`, spread over the buffers as distinct objects are. Seconds.
double PlainCopies(tierd::Device& device, tierd::Stream& stream, uint8_t* dst, const uint8_t* src,
                   uint64_t buffer_bytes, const std::vector<uint64_t>& sizes) {
  const Clock::time_point start = Clock::now();
  uint64_t at = 0;
  for (uint64_t size : sizes) {
    if (at + size > buffer_bytes) at = 0;
    Check(device.CopyAsync(stream, dst + at, src + at, size), "cudaMemcpyAsync");
    at += size;
  }
  Check(device.SynchronizeStream(stream), "synchronizing");
  return SecondsSince(start);
}

struct Buffers {
  std::unique_ptr<tierd::PinnedHostBuffer> host;
  std::unique_ptr<tierd::Slab> gpu;
};

Buffers AllocateBuffers(tierd::Device& device, uint64_t bytes) {
  Buffers buffers;
  buffers.host = Check(tierd::PinnedHostBuffer::Create(device, bytes), "pinned host buffer");
  std::memset(buffers.host->data(), 0x5a, bytes);
  buffers.gpu = Check(device.AllocateSlab(bytes), "GPU buffer");
  return buffers;
}

// ---- warm ---------------------------------------------------------------------------------------

nlohmann::json Warm(Bench& bench) {
  std::map<uint64_t, std::vector<Object>> classes;
  for (const Object& object : bench.objects()) classes[object.size].push_back(object);
  uint64_t largest_class = 0;
  for (const auto& [size, objects] : classes) {
    largest_class = std::max(largest_class, TotalBytes(objects));
  }
  Progress("warm: loading the model into the host cache");
  bench.FetchAll(bench.objects(), /*prefetch_first=*/true);
  Buffers buffers = AllocateBuffers(bench.device(), largest_class);
  std::unique_ptr<tierd::Stream> plain_stream =
      Check(bench.device().CreateStream(tierd::StreamPriority::kHigh), "stream");

  // Two ways to fetch a batch: one fetch after another (each answered once its copy is enqueued),
  // and a prefetch step for the whole batch followed by the fetches (the loader's pattern).
  nlohmann::json rows = nlohmann::json::array();
  double seconds_one_by_one = 0;
  double seconds_with_prefetch = 0;
  double seconds_plain = 0;
  uint64_t total_bytes = 0;
  for (const auto& [size, objects] : classes) {
    const uint64_t bytes = TotalBytes(objects);
    std::vector<uint64_t> sizes(objects.size(), size);
    std::vector<double> one_by_one_runs;
    std::vector<double> prefetch_runs;
    std::vector<double> plain_runs;
    for (int run = 0; run < absl::GetFlag(FLAGS_repeat); ++run) {
      plain_runs.push_back(
          bytes / 1e9 /
          PlainCopies(bench.device(), *plain_stream, static_cast<uint8_t*>(buffers.gpu->data()),
                      static_cast<const uint8_t*>(buffers.host->data()), largest_class, sizes));
      for (bool prefetch_first : {false, true}) {
        bench.Evict(bench.model() + "/", tierd::v1::TIER_GPU);
        const double gbps = bytes / 1e9 / bench.FetchAll(objects, prefetch_first);
        (prefetch_first ? prefetch_runs : one_by_one_runs).push_back(gbps);
      }
    }
    const double one_by_one = Median(one_by_one_runs);
    const double with_prefetch = Median(prefetch_runs);
    const double plain = Median(plain_runs);
    Progress(absl::StrFormat(
        "warm %s x %zu: tierd %.2f GB/s one by one (ratio %.3f), %.2f GB/s with a prefetch step "
        "(ratio %.3f); cudaMemcpyAsync %.2f GB/s",
        tierd::FormatByteSize(size), objects.size(), one_by_one, one_by_one / plain, with_prefetch,
        with_prefetch / plain, plain));
    rows.push_back({{"object_bytes", size},
                    {"objects", objects.size()},
                    {"tierd_one_by_one_gb_per_s", one_by_one_runs},
                    {"tierd_with_prefetch_gb_per_s", prefetch_runs},
                    {"plain_gb_per_s", plain_runs},
                    {"tierd_one_by_one_median_gb_per_s", one_by_one},
                    {"tierd_with_prefetch_median_gb_per_s", with_prefetch},
                    {"plain_median_gb_per_s", plain},
                    {"ratio_one_by_one", one_by_one / plain},
                    {"ratio_with_prefetch", with_prefetch / plain}});
    seconds_one_by_one += bytes / 1e9 / one_by_one;
    seconds_with_prefetch += bytes / 1e9 / with_prefetch;
    seconds_plain += bytes / 1e9 / plain;
    total_bytes += bytes;
  }
  Progress(
      absl::StrFormat("warm, all sizes: ratio %.3f one by one, %.3f with a prefetch step "
                      "(target >= 0.95)",
                      seconds_plain / seconds_one_by_one, seconds_plain / seconds_with_prefetch));
  nlohmann::json result = Environment(bench);
  result.update({{"benchmark", "warm_fetch"},
                 {"baseline",
                  "cudaMemcpyAsync from cudaHostRegister'ed memory, same sizes, "
                  "back to back on one stream"},
                 {"target", "tierd >= 0.95 x baseline"},
                 {"sizes", rows},
                 {"tierd_one_by_one_gb_per_s_all", total_bytes / 1e9 / seconds_one_by_one},
                 {"tierd_with_prefetch_gb_per_s_all", total_bytes / 1e9 / seconds_with_prefetch},
                 {"plain_gb_per_s_all", total_bytes / 1e9 / seconds_plain},
                 {"ratio_one_by_one_all", seconds_plain / seconds_one_by_one},
                 {"ratio_with_prefetch_all", seconds_plain / seconds_with_prefetch}});
  return result;
}

// ---- cold ---------------------------------------------------------------------------------------

// Runs the safetensors script on `files`; returns its GB/s, or a negative value when it failed.
double SafetensorsLoad(const std::vector<std::string>& files, bool drop_cache) {
  if (drop_cache) tierd::bench::DropPageCache();
  std::vector<std::string> args = {absl::GetFlag(FLAGS_python),
                                   absl::GetFlag(FLAGS_safetensors_script)};
  args.insert(args.end(), files.begin(), files.end());
  std::string command;
  for (const std::string& arg : args) absl::StrAppend(&command, "'", arg, "' ");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char line[256] = {};
  std::string output;
  while (std::fgets(line, sizeof(line), pipe) != nullptr) output += line;
  const int status = ::pclose(pipe);
  double gbps = -1;
  if (status != 0 || !absl::SimpleAtod(absl::StripAsciiWhitespace(output), &gbps)) {
    std::fprintf(stderr, "safetensors script failed: %s\n", output.c_str());
    return -1;
  }
  return gbps;
}

nlohmann::json Cold(Bench& bench) {
  const std::vector<std::string> files = bench.Files();
  const uint64_t bytes = TotalBytes(bench.objects());
  const bool with_safetensors = !absl::GetFlag(FLAGS_safetensors_script).empty();
  std::vector<double> tierd_runs;
  std::vector<double> fio_runs;
  std::vector<double> safetensors_runs;
  bool cold = true;
  nlohmann::json fio_raw;
  for (int run = 0; run < absl::GetFlag(FLAGS_repeat); ++run) {
    bench.Evict(bench.model() + "/", tierd::v1::TIER_ALL);
    cold &= tierd::bench::DropPageCache();
    tierd_runs.push_back(bytes / 1e9 / bench.FetchAll(bench.objects(), /*prefetch_first=*/true));
    cold &= tierd::bench::DropPageCache();
    tierd::bench::FioRead read;
    read.fio = absl::GetFlag(FLAGS_fio);
    read.files = files;
    read.queue_depth = absl::GetFlag(FLAGS_fio_queue_depth);
    fio_runs.push_back(tierd::bench::RunFio(read, &fio_raw));
    std::string line = absl::StrFormat("cold run %d: tierd %.3f GB/s, fio O_DIRECT %.3f GB/s", run,
                                       tierd_runs.back(), fio_runs.back());
    if (with_safetensors) {
      safetensors_runs.push_back(SafetensorsLoad(files, /*drop_cache=*/true));
      absl::StrAppendFormat(&line, ", safetensors %.3f GB/s", safetensors_runs.back());
    }
    Progress(line);
  }
  nlohmann::json result = Environment(bench);
  result.update({{"benchmark", "cold_load"},
                 {"files", files.size()},
                 {"bytes", bytes},
                 {"objects", bench.objects().size()},
                 {"page_cache_dropped", cold},
                 {"baseline", absl::StrCat("fio, io_uring, O_DIRECT, fixed buffers, 4 MiB reads, "
                                           "1 job, queue depth ",
                                           absl::GetFlag(FLAGS_fio_queue_depth),
                                           ", the same files one after another")},
                 {"target", "tierd >= 0.90 x fio"},
                 {"tierd_gb_per_s", tierd_runs},
                 {"fio_gb_per_s", fio_runs},
                 {"tierd_median_gb_per_s", Median(tierd_runs)},
                 {"fio_median_gb_per_s", Median(fio_runs)},
                 {"ratio_to_fio", Median(tierd_runs) / Median(fio_runs)}});
  if (with_safetensors) {
    // Warm: the page cache holds the files after one more read.
    SafetensorsLoad(files, /*drop_cache=*/false);
    const double warm = SafetensorsLoad(files, /*drop_cache=*/false);
    result["safetensors_cold_gb_per_s"] = safetensors_runs;
    result["safetensors_cold_median_gb_per_s"] = Median(safetensors_runs);
    result["safetensors_warm_gb_per_s"] = warm;
    result["ratio_to_safetensors_cold"] = Median(tierd_runs) / Median(safetensors_runs);
  }
  Progress(absl::StrFormat("cold: tierd %.3f GB/s, fio %.3f GB/s, ratio %.3f (target >= 0.90)",
                           Median(tierd_runs), Median(fio_runs),
                           Median(tierd_runs) / Median(fio_runs)));
  return result;
}

// ---- duplex -------------------------------------------------------------------------------------

nlohmann::json Duplex(Bench& bench) {
  const uint64_t store_bytes = absl::GetFlag(FLAGS_store_bytes).bytes;
  const int stores = absl::GetFlag(FLAGS_stores);
  const uint64_t h2d_bytes = TotalBytes(bench.objects());
  const uint64_t d2h_bytes = store_bytes * stores;
  const std::string store_prefix = "duplex-bench/";
  Progress("duplex: loading the model into the host cache");
  bench.FetchAll(bench.objects(), /*prefetch_first=*/true);

  // The storing side: its own session, stream and source buffer on the GPU.
  std::unique_ptr<tierd::Session> store_session =
      Check(bench.client().OpenSession(), "second session");
  tierd::Device& device = bench.device();
  std::unique_ptr<tierd::Stream> store_stream =
      Check(device.CreateStream(tierd::StreamPriority::kNormal), "stream");
  Buffers source = AllocateBuffers(device, store_bytes);
  Check(device.CopyAsync(*store_stream, source.gpu->data(), source.host->data(), store_bytes),
        "filling the store source");

  // The plain reference: the same sizes in both directions at once on two streams.
  uint64_t largest = store_bytes;
  std::vector<uint64_t> h2d_sizes;
  for (const Object& object : bench.objects()) {
    h2d_sizes.push_back(object.size);
    largest = std::max(largest, object.size);
  }
  const std::vector<uint64_t> d2h_sizes(stores, store_bytes);
  const uint64_t buffer_bytes = 2 * largest;
  Buffers to_gpu = AllocateBuffers(device, buffer_bytes);
  Buffers from_gpu = AllocateBuffers(device, buffer_bytes);
  std::unique_ptr<tierd::Stream> plain_h2d =
      Check(device.CreateStream(tierd::StreamPriority::kNormal), "stream");
  std::unique_ptr<tierd::Stream> plain_d2h =
      Check(device.CreateStream(tierd::StreamPriority::kNormal), "stream");

  std::vector<double> tierd_runs, tierd_h2d_runs, tierd_d2h_runs, plain_runs;
  for (int run = 0; run < absl::GetFlag(FLAGS_repeat); ++run) {
    {
      const Clock::time_point start = Clock::now();
      std::thread h2d([&] {
        PlainCopies(device, *plain_h2d, static_cast<uint8_t*>(to_gpu.gpu->data()),
                    static_cast<const uint8_t*>(to_gpu.host->data()), buffer_bytes, h2d_sizes);
      });
      PlainCopies(device, *plain_d2h, static_cast<uint8_t*>(from_gpu.host->data()),
                  static_cast<const uint8_t*>(from_gpu.gpu->data()), buffer_bytes, d2h_sizes);
      h2d.join();
      plain_runs.push_back((h2d_bytes + d2h_bytes) / 1e9 / SecondsSince(start));
    }
    bench.Evict(bench.model() + "/", tierd::v1::TIER_GPU);
    bench.Evict(store_prefix, tierd::v1::TIER_ALL);
    double h2d_seconds = 0;
    const Clock::time_point start = Clock::now();
    std::thread h2d([&] {
      h2d_seconds = bench.FetchAll(bench.objects(),
                                   /*prefetch_first=*/true);
    });
    for (int i = 0; i < stores; ++i) {
      tierd::StoreRequest store;
      store.key = absl::StrCat(store_prefix, i);
      store.data = source.gpu->data();
      store.size = store_bytes;
      store.spillable = false;
      Check(store_session->StoreAsync(store, *store_stream), "store " + store.key);
    }
    Check(store_session->Flush(), "flushing the stores");
    const double d2h_seconds = SecondsSince(start);
    h2d.join();
    const double seconds = SecondsSince(start);
    tierd_runs.push_back((h2d_bytes + d2h_bytes) / 1e9 / seconds);
    tierd_h2d_runs.push_back(h2d_bytes / 1e9 / h2d_seconds);
    tierd_d2h_runs.push_back(d2h_bytes / 1e9 / d2h_seconds);
    Progress(absl::StrFormat(
        "duplex run %d: tierd %.2f GB/s both ways (H2D %.2f, D2H %.2f), plain %.2f GB/s", run,
        tierd_runs.back(), tierd_h2d_runs.back(), tierd_d2h_runs.back(), plain_runs.back()));
  }
  bench.Evict(store_prefix, tierd::v1::TIER_ALL);
  nlohmann::json result = Environment(bench);
  result.update({{"benchmark", "duplex"},
                 {"h2d_bytes", h2d_bytes},
                 {"d2h_bytes", d2h_bytes},
                 {"reference_gb_per_s", 72.0},
                 {"baseline", "cudaMemcpyAsync H2D and D2H of the same sizes at once, two streams"},
                 {"tierd_gb_per_s", tierd_runs},
                 {"tierd_h2d_gb_per_s", tierd_h2d_runs},
                 {"tierd_d2h_gb_per_s", tierd_d2h_runs},
                 {"plain_gb_per_s", plain_runs},
                 {"tierd_median_gb_per_s", Median(tierd_runs)},
                 {"plain_median_gb_per_s", Median(plain_runs)},
                 {"ratio_to_72", Median(tierd_runs) / 72.0},
                 {"ratio_to_plain", Median(tierd_runs) / Median(plain_runs)}});
  return result;
}

// ---- latency ------------------------------------------------------------------------------------

// The floor any request/answer between two processes pays on this machine: a 64-byte message to
// a child process over a Unix socket pair and the child's 64-byte answer, both sides blocking in
// read(). Microseconds per round trip.
std::vector<double> UnixSocketPingPong(int round_trips) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) Die("socketpair failed");
  char message[64] = {};
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    while (::read(fds[1], message, sizeof(message)) == sizeof(message)) {
      if (::write(fds[1], message, sizeof(message)) != sizeof(message)) break;
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::vector<double> us;
  for (int i = 0; i < round_trips; ++i) {
    const Clock::time_point start = Clock::now();
    if (::write(fds[0], message, sizeof(message)) != sizeof(message) ||
        ::read(fds[0], message, sizeof(message)) != sizeof(message)) {
      Die("ping-pong over the socket pair failed");
    }
    us.push_back(SecondsSince(start) * 1e6);
  }
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return us;
}

nlohmann::json Summary(const std::vector<double>& us) {
  return nlohmann::json{{"count", us.size()},
                        {"p50_us", Percentile(us, 0.50)},
                        {"p90_us", Percentile(us, 0.90)},
                        {"p99_us", Percentile(us, 0.99)},
                        {"p999_us", Percentile(us, 0.999)},
                        {"max_us", Percentile(us, 1.0)}};
}

// Fetch latencies through `session` of `key` (pinned): each fetch followed by its release; the
// same with releases batched outside the timing; and a session request the daemon answers at
// once (unpinning what is not pinned).
nlohmann::json SessionLatencies(tierd::Session& session, tierd::Stream& stream,
                                const std::string& key, int fetches) {
  const int warmup = std::max(1000, fetches / 10);
  std::vector<double> fetch_us;
  for (int i = 0; i < warmup + fetches; ++i) {
    const Clock::time_point start = Clock::now();
    tierd::Lease lease = Check(session.Fetch(key, stream), "fetch");
    const double us = SecondsSince(start) * 1e6;
    if (i >= warmup) fetch_us.push_back(us);
    lease.Release(stream);
  }
  std::vector<double> batched_us;
  std::vector<tierd::Lease> held;
  for (int i = 0; i < fetches; ++i) {
    const Clock::time_point start = Clock::now();
    held.push_back(Check(session.Fetch(key, stream), "fetch"));
    batched_us.push_back(SecondsSince(start) * 1e6);
    if (held.size() == 100) held.clear();
  }
  held.clear();
  std::vector<double> round_trip_us;
  for (int i = 0; i < fetches; ++i) {
    const Clock::time_point start = Clock::now();
    (void)session.Unpin("latency-bench/never-pinned");
    round_trip_us.push_back(SecondsSince(start) * 1e6);
  }
  Progress(absl::StrFormat(
      "latency over %s: fetch p50 %.1f us, p99 %.1f us (targets 50, 200); releases batched: p50 "
      "%.1f us, p99 %.1f us; session round trip p50 %.1f us, p99 %.1f us",
      session.transport(), Percentile(fetch_us, 0.5), Percentile(fetch_us, 0.99),
      Percentile(batched_us, 0.5), Percentile(batched_us, 0.99), Percentile(round_trip_us, 0.5),
      Percentile(round_trip_us, 0.99)));
  return {{"transport", session.transport()},
          {"fetch", Summary(fetch_us)},
          {"fetch_releases_batched", Summary(batched_us)},
          {"session_round_trip", Summary(round_trip_us)}};
}

nlohmann::json Latency(Bench& bench) {
  const Object& object =
      *std::min_element(bench.objects().begin(), bench.objects().end(),
                        [](const Object& a, const Object& b) { return a.size < b.size; });
  Check(bench.session().Pin(object.key), "pin " + object.key);
  const int fetches = absl::GetFlag(FLAGS_fetches);
  // The session as clients get it (the session socket where the daemon has one), then one on the
  // gRPC Session stream.
  nlohmann::json sessions = nlohmann::json::array();
  sessions.push_back(SessionLatencies(bench.session(), bench.stream(), object.key, fetches));
  {
    tierd::ClientOptions options;
    options.socket_path = absl::GetFlag(FLAGS_socket);
    options.session_socket_path.clear();
    std::unique_ptr<tierd::Client> client = Check(tierd::Client::Connect(options), "connecting");
    std::unique_ptr<tierd::Session> session = Check(client->OpenSession(), "gRPC session");
    std::unique_ptr<tierd::Stream> stream =
        Check(session->device().CreateStream(tierd::StreamPriority::kHigh), "stream");
    sessions.push_back(SessionLatencies(*session, *stream, object.key, fetches));
  }
  Check(bench.session().Unpin(object.key), "unpin");
  // Context: a unary call, and the floor any request/answer between two processes pays here.
  std::vector<double> unary_us;
  for (int i = 0; i < 2000; ++i) {
    const Clock::time_point start = Clock::now();
    Check(bench.client().GetStats(), "GetStats");
    unary_us.push_back(SecondsSince(start) * 1e6);
  }
  const std::vector<double> socket_us = UnixSocketPingPong(fetches);
  Progress(absl::StrFormat(
      "latency context: unary GetStats p50 %.1f us; Unix socket ping-pong p50 %.1f us, p99 %.1f us",
      Percentile(unary_us, 0.5), Percentile(socket_us, 0.5), Percentile(socket_us, 0.99)));
  nlohmann::json result = Environment(bench);
  result.update({{"benchmark", "fetch_latency"},
                 {"object_bytes", object.size},
                 {"targets", "p50 <= 50 us, p99 <= 200 us (the first session)"},
                 {"sessions", sessions},
                 {"unary_get_stats", Summary(unary_us)},
                 {"unix_socket_ping_pong", Summary(socket_us)}});
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gpu_path_bench --mode=make-model|warm|cold|duplex|latency [--socket=SOCK] [--model=NAME] "
      "[--model-dir=DIR] [--json=OUT]");
  if (absl::StatusOr<std::vector<std::string>> parsed =
          tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
      !parsed.ok()) {
    std::fprintf(stderr, "gpu_path_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) absl::StrAppend(&command, i == 0 ? "" : " ", argv[i]);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "make-model") return MakeModel();
  nlohmann::json result;
  {
    Bench bench;
    if (mode == "warm") {
      result = Warm(bench);
    } else if (mode == "cold") {
      result = Cold(bench);
    } else if (mode == "duplex") {
      result = Duplex(bench);
    } else if (mode == "latency") {
      result = Latency(bench);
    } else {
      Die("--mode must be make-model, warm, cold, duplex or latency");
    }
  }
  result["command"] = command;
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) std::ofstream(json) << result.dump(2) << "\n";
  std::printf("%s\n", result.dump(2).c_str());
  return 0;
}
