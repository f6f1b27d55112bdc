// disk_read_bench --mode=host-load: a model on fast storage (tmpfs: buffered reads) loaded into the
// pinned host cache through tierd — a StorageStack with the daemon's default reader, every object
// fetched at once, checksummed as every read is — against plain threads pread-ing the same files
// into pinned memory, alternating, --repeat times each. Reports each run's GB/s, the medians and,
// for each reference thread count T, ratio = tierd median / reference median.
#ifndef TIERD_BENCH_HOST_LOAD_H_
#define TIERD_BENCH_HOST_LOAD_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "storage/host/host_cache.h"
#include "storage/io/disk_reader.h"

namespace tierd::bench {

struct HostLoadOptions {
  std::string model_dir;  // written there when missing (host_load_model.h)
  uint64_t model_bytes = 8ull << 30;
  uint64_t object_bytes = 64ull << 20;
  uint64_t shard_bytes = 2ull << 30;  // per safetensors file
  std::vector<int> reference_threads = {4, 8};
  int repeat = 3;
  std::string device = "auto";  // device spec: auto, host or cuda:N
  // Unset: the reader's defaults (DiskReaderOptions), which are the daemon's.
  std::optional<int> reader_threads;
  std::optional<int> reader_queue_depth;
  std::optional<uint64_t> reader_chunk_bytes;
  IoEngine reader_engine = IoEngine::kAuto;
  int checksum_threads = 0;  // 0: the host cache's default
  bool prefetch = false;     // prefetch every object, then wait for each; else fetch on demand
  std::string command_line;  // for the record
};

// Runs the comparison: progress on stderr, a table on stdout. Returns the record for --json. Dies
// (bench_support.h) on any error, on a loaded byte that differs from the file, and, before writing
// anything, when the model is larger than half of MemAvailable (each side pins a model-sized
// arena, one at a time, and a model on tmpfs is in memory too).
nlohmann::json RunHostLoad(const HostLoadOptions& options);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_HOST_LOAD_H_
