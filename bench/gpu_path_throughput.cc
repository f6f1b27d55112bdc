// gpu_path_bench's throughput modes: warm, cold and duplex.
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/gpu_path_flags.h"
#include "bench/gpu_path_session.h"
#include "bench/in_place_copies.h"

namespace tierd::bench {

// ---- warm ---------------------------------------------------------------------------------------

// --compressed: waits until the daemon's compressor has had every object of the model, so that
// the timed fetches find them in their final form; returns the host cache's compression figures.
nlohmann::json WaitForCompression(Bench& bench) {
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  while (true) {
    const tierd::v1::Stats stats = Check(bench.client().GetStats(), "GetStats");
    if (stats.objects_encoded() + stats.objects_kept_raw() >= bench.objects().size()) {
      const double ratio = static_cast<double>(stats.host_compressed_bytes()) /
                           std::max<uint64_t>(stats.host_compressed_raw_bytes(), 1);
      Progress(absl::StrFormat("warm: %u objects compressed to %.3f of their size, %u kept raw",
                               stats.objects_encoded(), ratio, stats.objects_kept_raw()));
      return {{"objects_encoded", stats.objects_encoded()},
              {"objects_kept_raw", stats.objects_kept_raw()},
              {"host_compressed_bytes", stats.host_compressed_bytes()},
              {"host_compressed_raw_bytes", stats.host_compressed_raw_bytes()},
              {"ratio", ratio}};
    }
    if (absl::Now() > deadline) {
      Die(absl::StrCat("--compressed: the daemon's compressor had ",
                       stats.objects_encoded() + stats.objects_kept_raw(), " of ",
                       bench.objects().size(),
                       " objects after 10 minutes (is the daemon running "
                       "with --compress-weights?)"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

nlohmann::json Warm(Bench& bench) {
  std::map<uint64_t, std::vector<Object>> classes;
  for (const Object& object : bench.objects()) classes[object.size].push_back(object);
  uint64_t largest_class = 0;
  for (const auto& [size, objects] : classes) {
    largest_class = std::max(largest_class, TotalBytes(objects));
  }
  Progress("warm: loading the model into the host cache");
  bench.FetchAll(bench.objects(), /*prefetch_first=*/true);
  const nlohmann::json compression =
      absl::GetFlag(FLAGS_compressed) ? WaitForCompression(bench) : nlohmann::json();
  const tierd::v1::Stats before = Check(bench.client().GetStats(), "GetStats");
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
  if (!compression.is_null()) {
    // What crossed the link: the timed fetches' compressed bytes over the raw bytes they gave.
    const tierd::v1::Stats after = Check(bench.client().GetStats(), "GetStats");
    result["host_compression"] = compression;
    result["timed_bytes_host_to_gpu"] = after.bytes_host_to_gpu() - before.bytes_host_to_gpu();
    result["timed_bytes_host_to_gpu_compressed"] =
        after.bytes_host_to_gpu_compressed() - before.bytes_host_to_gpu_compressed();
    result["decode_failures"] = after.decode_failures() - before.decode_failures();
  }
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

// Runs of a reference at each thread count, as JSON keyed by the count (`by_threads`); returns
// the best of their medians.
double BestMedian(const std::map<int, std::vector<double>>& runs, nlohmann::json& by_threads) {
  by_threads = nlohmann::json::object();
  double best = 0;
  for (const auto& [threads, gbps] : runs) {
    by_threads[std::to_string(threads)] = gbps;
    best = std::max(best, Median(gbps));
  }
  return best;
}

// The pread reference with the copy to the GPU beside it: each thread copies every read on at
// once, on a stream of its own, to `gpu` (room for `gpu_bytes`, a ring: only the rate counts).
// Seconds from the first read until every copy is done. What it reaches bounds a daemon that
// reads into pinned memory and copies from there: both the reads and the copies take the host's
// memory bandwidth.
double PreadThenCopy(Device& device, const std::vector<std::string>& files, uint8_t* host,
                     uint64_t host_bytes, uint8_t* gpu, uint64_t gpu_bytes, int threads) {
  constexpr uint64_t kReadBytes = 4ull << 20;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int t = 0; t < threads; ++t) {
    streams.push_back(Check(device.CreateStream(StreamPriority::kNormal), "stream"));
  }
  const absl::Time start = absl::Now();
  Check(PreadFiles(files, host, host_bytes, threads, kReadBytes,
                   [&](int thread, uint64_t position, uint64_t bytes) {
                     uint64_t at = position % gpu_bytes;
                     if (at + bytes > gpu_bytes) at = 0;
                     return device.CopyAsync(*streams[thread], gpu + at, host + position, bytes);
                   }),
        "the pread-then-copy reference");
  for (const std::unique_ptr<Stream>& stream : streams) {
    Check(device.SynchronizeStream(*stream), "the pread-then-copy reference's copies");
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

nlohmann::json Cold(Bench& bench) {
  const std::vector<std::string> files = bench.Files();
  const uint64_t bytes = TotalBytes(bench.objects());
  const bool with_safetensors = !absl::GetFlag(FLAGS_safetensors_script).empty();
  const bool with_fio = !absl::GetFlag(FLAGS_fio).empty();
  const std::vector<int> pread_threads =
      ParseThreadCounts(absl::GetFlag(FLAGS_pread_threads), "pread-threads", /*required=*/false);
  const std::vector<int> pread_copy_threads =
      pread_threads.empty() ? std::vector<int>{}
                            : ParseThreadCounts(absl::GetFlag(FLAGS_pread_copy_threads),
                                                "pread-copy-threads", /*required=*/false);
  const std::vector<int> in_place_threads =
      ParseThreadCounts(absl::GetFlag(FLAGS_in_place_threads), "in-place-threads",
                        /*required=*/false);
  uint64_t file_bytes = 0;
  for (const std::string& file : files) {
    std::error_code error;
    file_bytes += std::filesystem::file_size(file, error);
    if (error) Die("the size of " + file + ": " + error.message());
  }
  std::vector<uint64_t> sizes;
  uint64_t largest = 0;
  for (const Object& object : bench.objects()) {
    sizes.push_back(object.size);
    largest = std::max(largest, object.size);
  }
  std::unique_ptr<tierd::Stream> plain_stream =
      Check(bench.device().CreateStream(tierd::StreamPriority::kHigh), "stream");

  std::vector<double> tierd_runs;
  std::vector<double> fio_runs;
  std::vector<double> safetensors_runs;
  std::vector<double> link_runs;
  std::map<int, std::vector<double>> pread_runs;
  std::map<int, std::vector<double>> pread_copy_runs;
  std::map<int, std::vector<double>> in_place_runs;
  std::map<int, std::vector<nlohmann::json>> in_place_times;
  std::string in_place_error;
  bool cold = true;
  nlohmann::json fio_raw;
  uint64_t copied_as_landed = 0;  // of the timed fetches' bytes (GetStats)
  for (int run = 0; run < absl::GetFlag(FLAGS_repeat); ++run) {
    bench.Evict(bench.model() + "/", tierd::v1::TIER_ALL);
    cold &= tierd::bench::DropPageCache();
    const tierd::v1::Stats before = Check(bench.client().GetStats(), "GetStats");
    tierd_runs.push_back(bytes / 1e9 / bench.FetchAll(bench.objects(), /*prefetch_first=*/true));
    const tierd::v1::Stats after = Check(bench.client().GetStats(), "GetStats");
    copied_as_landed += after.bytes_copied_as_landed() - before.bytes_copied_as_landed();
    std::string line = absl::StrFormat(
        "cold run %d: tierd %.3f GB/s (%.2f of it copied to the GPU as it was read)", run,
        tierd_runs.back(),
        static_cast<double>(after.bytes_copied_as_landed() - before.bytes_copied_as_landed()) /
            static_cast<double>(bytes));
    if (with_fio) {
      cold &= tierd::bench::DropPageCache();
      tierd::bench::FioRead read;
      read.fio = absl::GetFlag(FLAGS_fio);
      read.files = files;
      read.queue_depth = absl::GetFlag(FLAGS_fio_queue_depth);
      fio_runs.push_back(tierd::bench::RunFio(read, &fio_raw));
      absl::StrAppendFormat(&line, ", fio O_DIRECT %.3f GB/s", fio_runs.back());
    }
    if (!pread_threads.empty()) {
      // The references' memory only while they run, not beside the daemon's load: the files'
      // bytes pinned (the pread's destination, then the copies' source) and room on the GPU for
      // two of the largest objects (the copies go round in it, as PlainCopies does).
      std::unique_ptr<tierd::PinnedHostBuffer> host = Check(
          tierd::PinnedHostBuffer::Create(bench.device(),
                                          std::max({file_bytes, bytes, 2 * largest})),
          "the references' pinned buffer");
      std::unique_ptr<tierd::Slab> gpu =
          Check(bench.device().AllocateSlab(2 * largest), "the link reference's GPU buffer");
      auto* const destination = static_cast<uint8_t*>(host->data());
      for (int threads : pread_threads) {
        cold &= tierd::bench::DropPageCache();
        const double seconds = Check(
            tierd::bench::PreadFiles(files, destination, host->size(), threads),
            "the pread reference");
        pread_runs[threads].push_back(file_bytes / 1e9 / seconds);
        absl::StrAppendFormat(&line, ", pread x%d %.3f GB/s", threads,
                              pread_runs[threads].back());
      }
      for (int threads : pread_copy_threads) {
        cold &= tierd::bench::DropPageCache();
        pread_copy_runs[threads].push_back(
            file_bytes / 1e9 /
            PreadThenCopy(bench.device(), files, destination, host->size(),
                          static_cast<uint8_t*>(gpu->data()), gpu->size(), threads));
        absl::StrAppendFormat(&line, ", pread then copy x%d %.3f GB/s", threads,
                              pread_copy_runs[threads].back());
      }
      link_runs.push_back(bytes / 1e9 /
                          PlainCopies(bench.device(), *plain_stream,
                                      static_cast<uint8_t*>(gpu->data()), destination,
                                      2 * largest, sizes));
      absl::StrAppendFormat(&line, ", cudaMemcpyAsync %.3f GB/s", link_runs.back());
    }
    if (!in_place_threads.empty() && in_place_error.empty()) {
      std::unique_ptr<tierd::Slab> gpu = Check(
          bench.device().AllocateSlab(std::max<uint64_t>(2 * largest, 128ull << 20)),
          "the in-place reference's GPU buffer");
      for (int threads : in_place_threads) {
        absl::StatusOr<InPlaceTimes> times = CopyFilesInPlace(
            bench.device(), files, static_cast<uint8_t*>(gpu->data()), gpu->size(), threads);
        if (!times.ok()) {
          // Not every platform registers file pages: said in the results, not fatal.
          in_place_error = times.status().ToString();
          absl::StrAppend(&line, ", in place: ", in_place_error);
          break;
        }
        in_place_runs[threads].push_back(file_bytes / 1e9 / times->to_gpu_seconds);
        in_place_times[threads].push_back({{"to_gpu_s", times->to_gpu_seconds},
                                           {"register_thread_s", times->register_seconds},
                                           {"unregister_s", times->unregister_seconds}});
        absl::StrAppendFormat(&line, ", in place x%d %.3f GB/s (registering %.3f s of %d threads, "
                              "unregistering %.3f s after)",
                              threads, in_place_runs[threads].back(), times->register_seconds,
                              threads, times->unregister_seconds);
      }
    }
    if (with_safetensors) {
      safetensors_runs.push_back(SafetensorsLoad(files, /*drop_cache=*/true));
      absl::StrAppendFormat(&line, ", safetensors %.3f GB/s", safetensors_runs.back());
    }
    Progress(line);
  }
  const double tierd = Median(tierd_runs);
  nlohmann::json result = Environment(bench);
  result.update({{"benchmark", "cold_load"},
                 {"files", files.size()},
                 {"bytes", bytes},
                 {"objects", bench.objects().size()},
                 {"page_cache_dropped", cold},
                 {"tierd_gb_per_s", tierd_runs},
                 {"tierd_median_gb_per_s", tierd},
                 {"share_copied_as_landed",
                  static_cast<double>(copied_as_landed) /
                      static_cast<double>(bytes * tierd_runs.size())}});
  std::string summary = absl::StrFormat("cold: tierd %.3f GB/s", tierd);
  if (with_fio) {
    const double fio = Median(fio_runs);
    result.update({{"baseline", absl::StrCat("fio, io_uring, O_DIRECT, fixed buffers, 4 MiB reads, "
                                             "1 job, queue depth ",
                                             absl::GetFlag(FLAGS_fio_queue_depth),
                                             ", the same files one after another")},
                   {"target", "tierd >= 0.90 x fio"},
                   {"fio_gb_per_s", fio_runs},
                   {"fio_median_gb_per_s", fio},
                   {"ratio_to_fio", tierd / fio}});
    absl::StrAppendFormat(&summary, ", fio %.3f GB/s, ratio %.3f (target >= 0.90)", fio,
                          tierd / fio);
  }
  if (!pread_threads.empty()) {
    nlohmann::json preads;
    const double best_pread = BestMedian(pread_runs, preads);
    const double link = Median(link_runs);
    const double bound = std::min(best_pread, link);
    result.update({{"pread_baseline", "T threads pread the files (a contiguous share each, 4 MiB "
                                      "reads) into pinned memory, for each T"},
                   {"pread_gb_per_s", preads},
                   {"best_pread_median_gb_per_s", best_pread},
                   {"link_baseline", "cudaMemcpyAsync of the objects' sizes from pinned memory, "
                                     "back to back on one stream"},
                   {"link_gb_per_s", link_runs},
                   {"link_median_gb_per_s", link},
                   {"memory_target", "tierd >= 0.90 x min(best pread, link)"},
                   {"ratio_to_memory_bound", tierd / bound}});
    absl::StrAppendFormat(&summary,
                          ", best pread %.3f GB/s, link %.3f GB/s, ratio to the smaller %.3f "
                          "(target on memory-backed files >= 0.90)",
                          best_pread, link, tierd / bound);
    if (!pread_copy_runs.empty()) {
      nlohmann::json copies;
      const double best_copy = BestMedian(pread_copy_runs, copies);
      result.update({{"pread_copy_baseline",
                      "T threads pread the files into pinned memory as the pread reference "
                      "does, each 4 MiB read copied on to the GPU at once on the thread's own "
                      "stream; until the last copy is done"},
                     {"pread_copy_gb_per_s", copies},
                     {"best_pread_copy_median_gb_per_s", best_copy},
                     {"ratio_to_pread_copy", tierd / best_copy}});
      absl::StrAppendFormat(&summary, ", best pread then copy %.3f GB/s (ratio %.3f)", best_copy,
                            tierd / best_copy);
    }
  }
  if (!in_place_threads.empty()) {
    nlohmann::json runs;
    const double best = BestMedian(in_place_runs, runs);
    nlohmann::json times = nlohmann::json::object();
    for (const auto& [threads, each] : in_place_times) times[std::to_string(threads)] = each;
    result.update({{"in_place_baseline",
                    "T threads register the mapped files' pages read-only with the device in "
                    "64 MiB pieces and copy each to the GPU once registered (no CPU copy); "
                    "unregistering timed apart"},
                   {"in_place_gb_per_s", runs},
                   {"in_place_times", times},
                   {"best_in_place_median_gb_per_s", best}});
    if (!in_place_error.empty()) result["in_place_error"] = in_place_error;
    if (best > 0) absl::StrAppendFormat(&summary, ", best in place %.3f GB/s", best);
  }
  if (with_safetensors) {
    // Warm: the page cache holds the files after one more read.
    SafetensorsLoad(files, /*drop_cache=*/false);
    const double warm = SafetensorsLoad(files, /*drop_cache=*/false);
    result["safetensors_cold_gb_per_s"] = safetensors_runs;
    result["safetensors_cold_median_gb_per_s"] = Median(safetensors_runs);
    result["safetensors_warm_gb_per_s"] = warm;
    result["ratio_to_safetensors_cold"] = tierd / Median(safetensors_runs);
  }
  Progress(summary);
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

}  // namespace tierd::bench
