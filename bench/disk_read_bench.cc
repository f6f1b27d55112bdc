// disk_read_bench: disk → pinned host throughput of tierd, against a plain reader in the same run.
//
//   disk_read_bench [--mode=direct] --file=/data/bench.bin --file-bytes=8GiB --device=auto
//                   [--json=out.json]
//   disk_read_bench --mode=host-load --model-dir=/dev/shm/model --model-bytes=8GiB
//                   [--object-bytes=64MiB] [--reference-threads=4,8] [--repeat=3] [--json=out.json]
//
// direct (the default): tierd's DiskReader beside fio on the same file with the same block size,
// queue depth, thread count, io_uring and O_DIRECT.
// The file is created (random bytes) when missing or too small. The whole file is read into a host
// arena pinned through the chosen device, in requests of --request-bytes, all queued at once (as a
// model load is); the wall time from first submit to last completion gives GB/s. fio reads the
// same file split across the same number of jobs. Each side runs --repeat times, alternating; the
// median is reported, and the ratio of the medians is the figure of merit.
//
// host-load: a safetensors model (written when missing) loaded into the host cache through a
// StorageStack with the daemon's default reader, against T threads pread-ing its files into pinned
// memory (bench/host_load.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "bench/host_load.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "device/device_factory.h"
#include "storage/host/host_arena.h"
#include "storage/io/disk_reader.h"

ABSL_FLAG(std::string, mode, "direct", "direct (O_DIRECT file against fio) or host-load");
ABSL_FLAG(std::string, file, "",
          "File to read (created when missing or smaller than --file-bytes)");
ABSL_FLAG(tierd::ByteSize, file_bytes, tierd::ByteSize{4ull << 30}, "Size of the file to read");
ABSL_FLAG(std::string, device, "auto", "Device that pins the arena: auto, host or cuda:N");
ABSL_FLAG(int, threads, 2, "Reader threads (fio: jobs)");
ABSL_FLAG(int, queue_depth, 16, "Reads in flight per thread (fio: iodepth)");
ABSL_FLAG(tierd::ByteSize, chunk_bytes, tierd::ByteSize{4ull << 20}, "Read size (fio: bs)");
ABSL_FLAG(tierd::ByteSize, request_bytes, tierd::ByteSize{64ull << 20},
          "Bytes per reader request (an object)");
ABSL_FLAG(int, repeat, 3, "Runs of each side");
ABSL_FLAG(std::string, fio, "fio", "fio binary; empty to skip the comparison");
ABSL_FLAG(bool, drop_caches, true, "Drop the page cache before each run (needs root)");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");
ABSL_FLAG(std::string, model_dir, "",
          "host-load: directory of the model (written there when missing)");
ABSL_FLAG(tierd::ByteSize, model_bytes, tierd::ByteSize{8ull << 30}, "host-load: model size");
ABSL_FLAG(tierd::ByteSize, object_bytes, tierd::ByteSize{64ull << 20},
          "host-load: bytes per object (one block of one tensor)");
ABSL_FLAG(tierd::ByteSize, shard_bytes, tierd::ByteSize{2ull << 30},
          "host-load: bytes per safetensors file, at most (whole objects)");
ABSL_FLAG(std::vector<std::string>, reference_threads, std::vector<std::string>({"4", "8"}),
          "host-load: thread counts of the pread reference, one run each");
ABSL_FLAG(int, reader_threads, 0, "host-load: the reader's threads; 0: its default");
ABSL_FLAG(int, reader_queue_depth, 0, "host-load: the reader's queue depth; 0: its default");
ABSL_FLAG(tierd::ByteSize, reader_chunk_bytes, tierd::ByteSize{0},
          "host-load: the reader's chunk (a multiple of 4 KiB); 0: its default");
ABSL_FLAG(std::string, reader_engine, "auto",
          "host-load: the reader's engine: auto, io_uring, pread");
ABSL_FLAG(int, checksum_threads, 0, "host-load: the host cache's checksum threads; 0: its default");
ABSL_FLAG(std::string, load, "fetch",
          "host-load: fetch (every object on demand) or prefetch (all, then fetch each)");

namespace {

using tierd::bench::Die;
using tierd::bench::Median;

void EnsureFile(const std::string& path, uint64_t bytes) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes) return;
  std::fprintf(stderr, "creating %s (%s of random bytes)...\n", path.c_str(),
               tierd::FormatByteSize(bytes).c_str());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::mt19937_64 random(1);
  std::vector<uint64_t> block(8 << 17);  // 8 MiB
  for (uint64_t written = 0; written < bytes;) {
    for (uint64_t& word : block) word = random();
    const uint64_t n = std::min<uint64_t>(block.size() * 8, bytes - written);
    out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(n));
    written += n;
  }
  out.close();
  if (!out) Die("cannot write " + path);
  ::sync();
}

void DropCaches() {
  if (absl::GetFlag(FLAGS_drop_caches)) tierd::bench::DropPageCache();
}

double ReadWithTierd(tierd::DiskReader& reader, tierd::HostArena& arena,
                     const tierd::ArenaAllocation& memory, const std::string& path,
                     uint64_t bytes) {
  const uint64_t request_bytes = absl::GetFlag(FLAGS_request_bytes).bytes;
  const int requests = static_cast<int>((bytes + request_bytes - 1) / request_bytes);
  absl::BlockingCounter pending(requests);
  std::atomic<int> failures{0};
  const absl::Time start = absl::Now();
  for (uint64_t offset = 0; offset < bytes; offset += request_bytes) {
    const uint64_t length = std::min(request_bytes, bytes - offset);
    // The arena holds the whole file at its own offsets: every range has its aligned window.
    reader.Submit({{{path, offset, length, arena.data(memory) + offset, /*aligned_window=*/true}},
                   tierd::ReadPriority::kPrefetch,
                   absl::InfiniteFuture(),
                   [&](absl::Status status) {
                     if (!status.ok()) {
                       std::fprintf(stderr, "read failed: %s\n", status.ToString().c_str());
                       ++failures;
                     }
                     pending.DecrementCount();
                   }});
  }
  pending.Wait();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (failures > 0) Die("reads failed");
  return bytes / seconds / 1e9;
}

double ReadWithFio(const std::string& path, uint64_t bytes, nlohmann::json* raw) {
  const int jobs = absl::GetFlag(FLAGS_threads);
  const uint64_t chunk = absl::GetFlag(FLAGS_chunk_bytes).bytes;
  tierd::bench::FioRead read;
  read.fio = absl::GetFlag(FLAGS_fio);
  read.files = {path};
  read.block_bytes = chunk;
  read.queue_depth = absl::GetFlag(FLAGS_queue_depth);
  read.jobs = jobs;
  read.bytes_per_job = bytes / jobs / chunk * chunk;
  return tierd::bench::RunFio(read, raw);
}

int HostLoad(int argc, char** argv) {
  tierd::bench::HostLoadOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model_dir);
  options.model_bytes = absl::GetFlag(FLAGS_model_bytes).bytes;
  options.object_bytes = absl::GetFlag(FLAGS_object_bytes).bytes;
  options.shard_bytes = absl::GetFlag(FLAGS_shard_bytes).bytes;
  options.reference_threads.clear();
  for (const std::string& text : absl::GetFlag(FLAGS_reference_threads)) {
    int threads = 0;
    if (!absl::SimpleAtoi(text, &threads) || threads <= 0 || threads > 1024) {
      Die("--reference-threads: \"" + text + "\" is not a thread count");
    }
    options.reference_threads.push_back(threads);
  }
  options.repeat = absl::GetFlag(FLAGS_repeat);
  options.device = absl::GetFlag(FLAGS_device);
  if (const int threads = absl::GetFlag(FLAGS_reader_threads); threads > 0) {
    options.reader_threads = threads;
  }
  const std::optional<tierd::IoEngine> engine =
      tierd::ParseIoEngine(absl::GetFlag(FLAGS_reader_engine));
  if (!engine) Die("--reader-engine must be auto, io_uring or pread");
  options.reader_engine = *engine;
  if (const int threads = absl::GetFlag(FLAGS_checksum_threads); threads > 0) {
    options.checksum_threads = threads;
  }
  if (const int depth = absl::GetFlag(FLAGS_reader_queue_depth); depth > 0) {
    options.reader_queue_depth = depth;
  }
  if (const uint64_t chunk = absl::GetFlag(FLAGS_reader_chunk_bytes).bytes; chunk > 0) {
    options.reader_chunk_bytes = chunk;
  }
  const std::string load = absl::GetFlag(FLAGS_load);
  if (load != "fetch" && load != "prefetch") Die("--load must be fetch or prefetch");
  options.prefetch = load == "prefetch";
  for (int i = 0; i < argc; ++i) absl::StrAppend(&options.command_line, i == 0 ? "" : " ", argv[i]);
  const nlohmann::json result = tierd::bench::RunHostLoad(options);
  if (const std::string json = absl::GetFlag(FLAGS_json); !json.empty()) {
    std::ofstream out(json);
    out << result.dump(2) << "\n";
    if (!out) Die("cannot write " + json);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "disk_read_bench [--mode=direct] --file=PATH [--file-bytes=4GiB] [--device=auto]\n"
      "       disk_read_bench --mode=host-load --model-dir=DIR [--model-bytes=8GiB] "
      "[--reference-threads=4,8]");
  if (absl::StatusOr<std::vector<std::string>> parsed =
          tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
      !parsed.ok()) {
    std::fprintf(stderr, "disk_read_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "host-load") return HostLoad(argc, argv);
  if (mode != "direct") Die("--mode must be direct or host-load");
  const std::string path = absl::GetFlag(FLAGS_file);
  if (path.empty()) Die("--file is required");
  const uint64_t bytes = absl::GetFlag(FLAGS_file_bytes).bytes;
  EnsureFile(path, bytes);

  auto spec = tierd::ParseDeviceSpec(absl::GetFlag(FLAGS_device));
  if (!spec.ok()) Die(spec.status().ToString());
  auto device = tierd::CreateDevice(*spec);
  if (!device.ok()) Die(device.status().ToString());
  auto arena = tierd::HostArena::Create(**device, {bytes, 1ull << 30});
  if (!arena.ok()) Die(arena.status().ToString());
  (*arena)->WaitUntilFullyPinned(absl::InfiniteDuration());
  auto memory = (*arena)->Allocate(bytes);
  if (!memory) Die("arena allocation failed");

  tierd::DiskReaderOptions options;
  options.threads = absl::GetFlag(FLAGS_threads);
  options.queue_depth = absl::GetFlag(FLAGS_queue_depth);
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes).bytes;
  auto reader = tierd::DiskReader::Create(options);
  if (!reader.ok()) Die(reader.status().ToString());

  const bool with_fio = !absl::GetFlag(FLAGS_fio).empty();
  std::vector<double> tierd_runs;
  std::vector<double> fio_runs;
  nlohmann::json fio_raw;
  for (int run = 0; run < absl::GetFlag(FLAGS_repeat); ++run) {
    DropCaches();
    // A daemon's arena is long since touched, as fio's buffers are before it times anything. On a
    // virtual machine whose host reclaims guest memory, pages fio's run displaced would otherwise
    // be faulted in again inside the timed run (seen: 0.24 GB/s first touch against 4+ GB/s reads).
    std::memset((*arena)->data(*memory), 0, bytes);
    tierd_runs.push_back(ReadWithTierd(**reader, **arena, *memory, path, bytes));
    std::fprintf(stderr, "run %d: tierd %.3f GB/s", run, tierd_runs.back());
    if (with_fio) {
      DropCaches();
      fio_runs.push_back(ReadWithFio(path, bytes, &fio_raw));
      std::fprintf(stderr, ", fio %.3f GB/s", fio_runs.back());
    }
    std::fprintf(stderr, "\n");
  }
  const tierd::DiskReaderStats stats = (*reader)->stats();
  nlohmann::json result = {
      {"benchmark", "disk_read"},
      {"file_bytes", bytes},
      {"device", (*device)->Describe()},
      {"threads", options.threads},
      {"queue_depth", options.queue_depth},
      {"chunk_bytes", options.chunk_bytes},
      {"request_bytes", absl::GetFlag(FLAGS_request_bytes).bytes},
      {"engine", tierd::IoEngineName(stats.engine)},
      {"buffered_files", stats.buffered_files},
      {"memory_files", stats.memory_files},
      {"tierd_gb_per_s", tierd_runs},
      {"tierd_median_gb_per_s", Median(tierd_runs)},
  };
  std::printf("tierd DiskReader: %.3f GB/s (median of %zu)\n", Median(tierd_runs),
              tierd_runs.size());
  if (with_fio) {
    result["fio_gb_per_s"] = fio_runs;
    result["fio_median_gb_per_s"] = Median(fio_runs);
    result["ratio_to_fio"] = Median(tierd_runs) / Median(fio_runs);
    std::printf("fio io_uring O_DIRECT: %.3f GB/s (median of %zu)\nratio: %.3f\n", Median(fio_runs),
                fio_runs.size(), Median(tierd_runs) / Median(fio_runs));
  }
  if (const std::string json = absl::GetFlag(FLAGS_json); !json.empty()) {
    std::ofstream(json) << result.dump(2) << "\n";
  }
  memory.reset();  // before the arena goes
  return 0;
}
