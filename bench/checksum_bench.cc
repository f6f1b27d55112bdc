// checksum_bench: what checking an object as its chunks land costs the threads that read it.
//
// T threads copy an object's chunks (--chunk-bytes, interleaved: thread t takes chunks t, t + T,
// ...) from a source buffer into the object's memory — the stand-in for a reader thread's read —
// and, on the measured side, tell each chunk to a StreamingChecksum as a reader thread does, which
// hashes what the landing lets it; the object is done when Finish returns. The reference is the
// same copies told to no one. The two sides alternate, --repeat times each, for each T; every
// measured run's checksum must equal one computed in a single landing of the whole object.
//
//   checksum_bench [--object-bytes=512MiB] [--chunk-bytes=4MiB] [--threads=1,2,4]
//                  [--repeat=5] [--json=PATH]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "bench/bench_support.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "storage/model/streaming_checksum.h"

ABSL_FLAG(tierd::ByteSize, object_bytes, tierd::ByteSize{512ull << 20}, "The object's size");
ABSL_FLAG(tierd::ByteSize, chunk_bytes, tierd::ByteSize{4ull << 20},
          "A read's size (the daemon's readers read 4 MiB)");
ABSL_FLAG(std::vector<std::string>, threads, std::vector<std::string>({"1", "2", "4"}),
          "Reader thread counts, comma-separated");
ABSL_FLAG(int, repeat, 5, "Runs of each side per thread count");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace {

using tierd::bench::Clock;
using tierd::bench::Die;
using tierd::bench::Median;
using tierd::bench::SecondsSince;

// One run: `threads` threads copy the chunks of `source` into `object`, telling `checksum` of each
// when it is not null; returns the seconds until the last copy (and the checksum's Finish).
double Run(const std::vector<uint8_t>& source, std::vector<uint8_t>& object, uint64_t chunk,
           int threads, tierd::StreamingChecksum* checksum, std::optional<uint64_t>* sum) {
  const uint64_t size = object.size();
  const uint64_t chunks = (size + chunk - 1) / chunk;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> readers;
  for (int t = 0; t < threads; ++t) {
    readers.emplace_back([&, t] {
      for (uint64_t c = t; c < chunks; c += threads) {
        const uint64_t begin = c * chunk;
        const uint64_t end = std::min(size, begin + chunk);
        std::memcpy(object.data() + begin, source.data() + begin, end - begin);
        if (checksum != nullptr) checksum->Landed(begin, end);
      }
    });
  }
  for (std::thread& reader : readers) reader.join();
  if (checksum != nullptr) *sum = checksum->Finish();
  return SecondsSince(start);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "checksum_bench [--object-bytes=512MiB] [--chunk-bytes=4MiB] [--threads=1,2,4] "
      "[--repeat=5] [--json=PATH]");
  if (absl::StatusOr<std::vector<std::string>> parsed =
          tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
      !parsed.ok()) {
    std::fprintf(stderr, "checksum_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const uint64_t size = absl::GetFlag(FLAGS_object_bytes).bytes;
  const uint64_t chunk = absl::GetFlag(FLAGS_chunk_bytes).bytes;
  const int repeat = absl::GetFlag(FLAGS_repeat);
  if (size == 0 || chunk == 0 || repeat < 1) {
    Die("--object-bytes, --chunk-bytes and --repeat must be more than 0");
  }
  const std::vector<int> thread_counts =
      tierd::bench::ParseThreadCounts(absl::GetFlag(FLAGS_threads), "threads");

  std::vector<uint8_t> source(size);
  std::mt19937_64 random(7);
  for (uint64_t i = 0; i < size; i += 8) {
    const uint64_t word = random();
    std::memcpy(source.data() + i, &word, std::min<uint64_t>(8, size - i));
  }
  std::vector<uint8_t> object(size, 0);  // touched: no run pays the first faults
  std::optional<uint64_t> expected;
  {
    tierd::StreamingChecksum whole(source.data(), size);
    whole.Landed(0, size);
    expected = whole.Finish();
  }

  nlohmann::json result = {{"benchmark", "checksum_while_landing"},
                           {"date", tierd::bench::TodayUtc()},
                           {"object_bytes", size},
                           {"chunk_bytes", chunk},
                           {"cores", std::thread::hardware_concurrency()}};
  nlohmann::json runs = nlohmann::json::array();
  for (int threads : thread_counts) {
    std::vector<double> copies, checked;
    for (int r = 0; r < repeat; ++r) {
      copies.push_back(size / 1e9 / Run(source, object, chunk, threads, nullptr, nullptr));
      tierd::StreamingChecksum checksum(object.data(), size);
      std::optional<uint64_t> sum;
      checked.push_back(size / 1e9 / Run(source, object, chunk, threads, &checksum, &sum));
      if (sum != expected) Die("a run's checksum differs from the whole object's");
    }
    const double copy = Median(copies), check = Median(checked);
    std::printf("%d thread(s): copies %.2f GB/s, copies told to the checksum %.2f GB/s (%.3f)\n",
                threads, copy, check, check / copy);
    runs.push_back({{"threads", threads},
                    {"copies_gb_per_s", copies},
                    {"checked_gb_per_s", checked},
                    {"copies_median_gb_per_s", copy},
                    {"checked_median_gb_per_s", check},
                    {"checked_over_copies", check / copy}});
  }
  result["runs"] = runs;
  if (const std::string json = absl::GetFlag(FLAGS_json); !json.empty()) {
    std::ofstream(json) << result.dump(2) << "\n";
  }
  return 0;
}
