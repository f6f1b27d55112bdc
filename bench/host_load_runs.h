// The two timed loads disk_read_bench --mode=host-load compares, each into memory pinned through
// the same device and each checked byte for byte against the files afterwards (outside the time):
//  - through tierd: a fresh StorageStack, the model registered with block grouping, every object
//    fetched (or prefetched) through the HostCache at once, timed from the first submit until each
//    callback has its object resident — the host cache's checksum of every read included;
//  - the reference: T threads pread-ing the model's files, each a contiguous share of their bytes
//    in 4 MiB reads, into one HostArena allocation.
// Both die on any error (bench_support.h).
#ifndef TIERD_BENCH_HOST_LOAD_RUNS_H_
#define TIERD_BENCH_HOST_LOAD_RUNS_H_

#include <cstddef>
#include <optional>
#include <string>

#include "bench/host_load_model.h"
#include "device/device.h"
#include "storage/host/host_cache_stats.h"
#include "storage/io/disk_reader.h"

namespace tierd::bench {

// The name the model is registered under.
inline constexpr char kHostLoadModelName[] = "hostload";

struct TierdLoadSettings {
  // The stack's state directory. Kept from one load to the next, so that the first load records
  // the objects' checksums in the catalog and later ones verify them.
  std::string state_dir;
  // Unset: sized as the daemon's --reader-threads=auto sizes them for a model root at the model's
  // directory (storage/io/reader_sizing.h).
  std::optional<int> reader_threads;
  // Unset: the DiskReaderOptions default, which is the daemon's.
  std::optional<int> reader_queue_depth;
  std::optional<uint64_t> reader_chunk_bytes;
  IoEngine reader_engine = IoEngine::kAuto;
  int checksum_threads = 0;  // 0: the host cache's default
  // Prefetch every object, then wait for each with Fetch; otherwise Fetch each on demand.
  bool prefetch = false;
  int verify_threads = 1;
};

struct TierdLoadResult {
  double gb_per_s = 0;
  // True when the catalog held no checksum before this load (it recorded them); false when it
  // verified them.
  bool recorded_checksums = false;
  DiskReaderOptions reader;   // the options the stack's reader was built with
  std::string reader_sizing;  // why it has reader.threads threads, when they were sized
  DiskReaderStats reader_stats;
  HostCacheStats cache_stats;
  size_t verified_objects = 0;
};

// Builds a stack on `device` with an arena that holds the model, loads it, checks it, tears the
// stack down.
TierdLoadResult LoadThroughTierd(Device& device, const HostLoadModel& model,
                                 const TierdLoadSettings& settings);

struct PreadLoadResult {
  double gb_per_s = 0;
  size_t verified_objects = 0;
};

// Creates an arena on `device` for the model's files, reads them on `threads` threads, checks the
// objects, frees the arena.
PreadLoadResult LoadWithPread(Device& device, const HostLoadModel& model, int threads,
                              int verify_threads);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_HOST_LOAD_RUNS_H_
