#include "bench/host_load_runs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "common/fd_io.h"
#include "common/free_ranges.h"
#include "common/machine.h"
#include "common/posix_error.h"
#include "storage/host/host_arena.h"
#include "storage/host/host_cache.h"
#include "storage/io/reader_sizing.h"
#include "storage/storage_stack.h"

namespace tierd::bench {
namespace {

constexpr uint64_t kPageBytes = 4096;
constexpr uint64_t kReadBytes = 4ull << 20;  // the reference's read size
constexpr uint64_t kPinPieceBytes = 1ull << 30;

std::string ObjectKey(const HostLoadObject& object) {
  return absl::StrCat(kHostLoadModelName, "/", object.name);
}

// Pinning runs in the background; a daemon's arena is long since pinned when a model loads.
void WaitForPinning(const HostArena& arena) {
  if (!arena.WaitUntilFullyPinned(absl::InfiniteDuration())) {
    Check(arena.pin_status(), "pinning the host arena");
    Die("the host arena stopped pinning before it was whole");
  }
}

// Registers the model in a catalog that does not know it yet (a later stack's catalog loads it
// from the state directory).
void RegisterOnce(Catalog& catalog, const HostLoadModel& model) {
  if (catalog.GetModel(kHostLoadModelName).ok()) return;
  const ModelSummary summary =
      Check(catalog.RegisterModel(kHostLoadModelName, model.directory, Grouping::kBlock,
                                  GroupingRules::Defaults()),
            "registering the model");
  if (summary.objects != model.objects.size() || summary.total_bytes != model.object_bytes) {
    Die(absl::StrCat("the catalog found ", summary.objects, " objects of ", summary.total_bytes,
                     " bytes in ", model.directory, "; the benchmark wrote ", model.objects.size(),
                     " of ", model.object_bytes));
  }
}

}  // namespace

TierdLoadResult LoadThroughTierd(Device& device, const HostLoadModel& model,
                                 const TierdLoadSettings& settings) {
  StorageStackOptions options;
  options.state_dir = settings.state_dir;
  options.durable_store = false;
  // Each object takes whole pages, from the page its first byte is on; a little more for slack.
  uint64_t arena_bytes = 64ull << 20;
  for (const HostLoadObject& object : model.objects) {
    arena_bytes += RoundUp(object.offset % kPageBytes + object.bytes, kPageBytes);
  }
  options.arena = {arena_bytes, kPinPieceBytes};
  std::string reader_sizing;
  if (settings.reader_threads) {
    options.reader.threads = *settings.reader_threads;
  } else {
    const ReaderSizing sizing = SizeReaders({model.directory}, UsableCpus());
    options.reader.threads = sizing.threads;
    reader_sizing = sizing.why;
  }
  if (settings.reader_queue_depth) options.reader.queue_depth = *settings.reader_queue_depth;
  if (settings.reader_chunk_bytes) options.reader.chunk_bytes = *settings.reader_chunk_bytes;
  options.reader.engine = settings.reader_engine;
  options.host_cache.checksum_threads = settings.checksum_threads;
  std::unique_ptr<StorageStack> stack =
      Check(StorageStack::Create(device, options), "building the storage stack");
  WaitForPinning(stack->arena());
  RegisterOnce(stack->catalog(), model);

  TierdLoadResult result;
  result.reader = options.reader;
  result.reader_sizing = reader_sizing;
  result.recorded_checksums = !stack->catalog().Checksum(ObjectKey(model.objects[0])).has_value();
  HostCache& cache = stack->host_cache();
  const size_t count = model.objects.size();
  std::vector<std::string> keys;
  for (const HostLoadObject& object : model.objects) keys.push_back(ObjectKey(object));
  // Each callback fills its own slot; pending.Wait() orders the writes before the reads below.
  std::vector<HostObject> resident(count);
  absl::BlockingCounter pending(static_cast<int>(count));
  FirstError errors;

  const Clock::time_point start = Clock::now();
  if (settings.prefetch) {
    for (const std::string& key : keys) Check(cache.Prefetch(key, absl::InfiniteFuture()), key);
  }
  const ReadPriority priority = settings.prefetch ? ReadPriority::kPrefetch : ReadPriority::kDemand;
  for (size_t i = 0; i < count; ++i) {
    cache.Fetch(keys[i], priority, absl::InfiniteFuture(),
                [&, i](absl::StatusOr<HostObject> object) {
                  if (object.ok()) {
                    resident[i] = *std::move(object);
                  } else {
                    errors.Note(absl::StrCat(keys[i], ": ", object.status().ToString()));
                  }
                  pending.DecrementCount();
                });
  }
  pending.Wait();
  const double seconds = SecondsSince(start);
  errors.DieIfAny("loading through tierd");
  result.gb_per_s = static_cast<double>(model.object_bytes) / seconds / 1e9;

  for (size_t i = 0; i < count; ++i) {
    if (resident[i].size() != model.objects[i].bytes) {
      Die(absl::StrCat(keys[i], " came back with ", resident[i].size(), " bytes, not ",
                       model.objects[i].bytes));
    }
  }
  result.verified_objects = VerifyHostLoadObjects(
      model, [&](size_t i) -> const uint8_t* { return resident[i].data(); },
      settings.verify_threads);
  resident.clear();  // every reference goes before the cache does
  result.reader_stats = stack->reader().stats();
  result.cache_stats = cache.stats();
  if (result.cache_stats.checksum_failures != 0) Die("the host cache counted checksum failures");
  return result;
}

PreadLoadResult LoadWithPread(Device& device, const HostLoadModel& model, int threads,
                              int verify_threads) {
  const uint64_t total = model.file_bytes;
  std::unique_ptr<HostArena> arena = Check(
      HostArena::Create(device, {RoundUp(total, kPageBytes), kPinPieceBytes}), "the host arena");
  WaitForPinning(*arena);
  std::optional<ArenaAllocation> memory = arena->Allocate(total);
  if (!memory) Die("the reference's arena has no room for the model");
  uint8_t* const destination = arena->data(*memory);
  std::vector<std::string> paths;
  std::vector<uint64_t> file_start = {0};  // file f's bytes land at file_start[f]
  for (const HostLoadFile& file : model.files) {
    paths.push_back(file.path);
    file_start.push_back(file_start.back() + file.bytes);
  }
  const double seconds = Check(PreadFiles(paths, destination, total, threads, kReadBytes),
                               "the pread reference");

  PreadLoadResult result;
  result.gb_per_s = static_cast<double>(total) / seconds / 1e9;
  result.verified_objects = VerifyHostLoadObjects(
      model,
      [&](size_t i) -> const uint8_t* {
        const HostLoadObject& object = model.objects[i];
        return destination + file_start[object.file] + object.offset;
      },
      verify_threads);
  memory.reset();  // before the arena goes
  return result;
}

}  // namespace tierd::bench
