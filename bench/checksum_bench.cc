// checksum_bench: what checking an object as its chunks land costs the threads that read it.
//
// T threads copy an object's chunks (--chunk-bytes, interleaved: thread t takes chunks t, t + T,
// ...) into the object's memory — memcpy from a buffer, or with --source-file pread from a file
// (on tmpfs: the kernel's copy out of memory, as a reader thread's read is) — and, on the measured
// side ("landed"), tell each chunk to a StreamingChecksum as a reader thread does, which hashes
// what the landing lets it; the object is done when Finish returns. The reference ("copies") is
// the same copies told to no one. With --piece-bytes two more sides: each chunk copied in pieces
// of that size told to no one ("pieces"), and the same with each piece hashed into its segment's
// xxHash3 state right after its copy ("pieces_hashed": the bytes still in the core's cache; a
// chunk is one segment, so the checksum is the same). The sides alternate, --repeat times each,
// for each T; every run that computes a checksum must get the object's.
//
//   checksum_bench [--object-bytes=512MiB] [--chunk-bytes=4MiB] [--threads=1,2,4]
//                  [--source-file=/dev/shm/checksum_bench.bin] [--piece-bytes=256KiB]
//                  [--repeat=5] [--json=PATH]
#include <fcntl.h>
#include <unistd.h>

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
#include "storage/model/object_checksum.h"
#include "storage/model/streaming_checksum.h"

ABSL_FLAG(tierd::ByteSize, object_bytes, tierd::ByteSize{512ull << 20}, "The object's size");
ABSL_FLAG(tierd::ByteSize, chunk_bytes, tierd::ByteSize{4ull << 20},
          "A read's size (the daemon's readers read 4 MiB)");
ABSL_FLAG(std::vector<std::string>, threads, std::vector<std::string>({"1", "2", "4"}),
          "Reader thread counts, comma-separated");
ABSL_FLAG(int, repeat, 5, "Runs of each side per thread count");
ABSL_FLAG(std::string, source_file, "",
          "Read the chunks with pread from a file written here (put it on tmpfs) and removed once "
          "open, as a reader thread reads memory-backed files; empty: memcpy from a buffer");
ABSL_FLAG(tierd::ByteSize, piece_bytes, tierd::ByteSize{0},
          "Also time chunks read in pieces of this size, each hashed into its segment's state "
          "right after it lands (a chunk being one segment); 0: not");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace {

using tierd::bench::Clock;
using tierd::bench::Die;
using tierd::bench::Median;
using tierd::bench::SecondsSince;

// Where the chunks come from: a buffer (memcpy) or a file (pread, the kernel's copy out of the
// page cache, as a reader thread's read of a memory-backed file is).
struct Source {
  const uint8_t* buffer = nullptr;
  int fd = -1;

  void CopyTo(uint8_t* destination, uint64_t offset, uint64_t length) const {
    if (fd < 0) {
      std::memcpy(destination, buffer + offset, length);
      return;
    }
    while (length > 0) {
      const ssize_t n = ::pread(fd, destination, length, static_cast<off_t>(offset));
      if (n <= 0) Die("reading the source file");
      destination += n;
      offset += static_cast<uint64_t>(n);
      length -= static_cast<uint64_t>(n);
    }
  }
};

enum class Side {
  kCopies,        // the chunks copied whole, told to no one: the reference
  kLanded,        // each chunk copied whole, then told to a StreamingChecksum (the reader's way)
  kPieces,        // each chunk copied in pieces, told to no one
  kPiecesHashed,  // each chunk copied in pieces, each piece hashed into the chunk's segment
                  // state right after its copy, while its bytes are in the core's cache
};

// One run: `threads` threads copy the chunks of `source` into `object` (thread t takes chunks t,
// t + T, ...) as `side` says; returns the seconds until the last copy (and the checksum's Finish),
// and in `sum` the object's checksum where the side computes one.
double Run(const Source& source, std::vector<uint8_t>& object, uint64_t chunk, uint64_t piece,
           int threads, Side side, std::optional<uint64_t>* sum) {
  const uint64_t size = object.size();
  const uint64_t chunks = (size + chunk - 1) / chunk;
  std::optional<tierd::StreamingChecksum> checksum;
  if (side == Side::kLanded) checksum.emplace(object.data(), size);
  std::vector<uint64_t> segments(side == Side::kPiecesHashed ? chunks : 0);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> readers;
  for (int t = 0; t < threads; ++t) {
    readers.emplace_back([&, t] {
      const tierd::Xxh3State state = tierd::NewXxh3State();
      for (uint64_t c = t; c < chunks; c += threads) {
        const uint64_t begin = c * chunk;
        const uint64_t end = std::min(size, begin + chunk);
        switch (side) {
          case Side::kCopies:
          case Side::kLanded:
            source.CopyTo(object.data() + begin, begin, end - begin);
            if (checksum) checksum->Landed(begin, end);
            break;
          case Side::kPieces:
          case Side::kPiecesHashed:
            XXH3_64bits_reset(state.get());
            for (uint64_t at = begin; at < end; at += piece) {
              const uint64_t length = std::min(piece, end - at);
              source.CopyTo(object.data() + at, at, length);
              if (side == Side::kPiecesHashed)
                XXH3_64bits_update(state.get(), object.data() + at, length);
            }
            if (side == Side::kPiecesHashed) segments[c] = XXH3_64bits_digest(state.get());
            break;
        }
      }
    });
  }
  for (std::thread& reader : readers) reader.join();
  if (checksum) *sum = checksum->Finish();
  if (side == Side::kPiecesHashed) *sum = tierd::CombineSegmentChecksums(size, segments);
  return SecondsSince(start);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "checksum_bench [--object-bytes=512MiB] [--chunk-bytes=4MiB] [--threads=1,2,4] "
      "[--source-file=PATH] [--piece-bytes=256KiB] [--repeat=5] [--json=PATH]");
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

  const uint64_t piece = absl::GetFlag(FLAGS_piece_bytes).bytes;
  if (piece > 0 && chunk != tierd::kChecksumSegmentBytes) {
    Die("--piece-bytes hashes each chunk as one segment: --chunk-bytes must be the segment's " +
        tierd::FormatByteSize(tierd::kChecksumSegmentBytes));
  }

  std::vector<uint8_t> bytes(size);
  std::mt19937_64 random(7);
  for (uint64_t i = 0; i < size; i += 8) {
    const uint64_t word = random();
    std::memcpy(bytes.data() + i, &word, std::min<uint64_t>(8, size - i));
  }
  Source source{bytes.data(), -1};
  const std::string source_file = absl::GetFlag(FLAGS_source_file);
  if (!source_file.empty()) {
    std::ofstream out(source_file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(size));
    out.close();
    if (!out) Die("cannot write " + source_file);
    source.fd = ::open(source_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (source.fd < 0) Die("cannot open " + source_file);
    ::unlink(source_file.c_str());  // read through the descriptor: nothing is left in tmpfs
  }
  std::vector<uint8_t> object(size, 0);  // touched: no run pays the first faults
  const uint64_t expected = tierd::ObjectChecksum(bytes.data(), size);

  nlohmann::json result = {{"benchmark", "checksum_while_landing"},
                           {"date", tierd::bench::TodayUtc()},
                           {"object_bytes", size},
                           {"chunk_bytes", chunk},
                           {"piece_bytes", piece},
                           {"source", source.fd < 0 ? "memcpy from a buffer" : "pread from a file"},
                           {"cores", std::thread::hardware_concurrency()}};
  nlohmann::json runs = nlohmann::json::array();
  struct Timed {
    Side side;
    const char* name;
    std::vector<double> gb_per_s;
  };
  for (int threads : thread_counts) {
    std::vector<Timed> sides = {{Side::kCopies, "copies", {}}, {Side::kLanded, "landed", {}}};
    if (piece > 0) {
      sides.push_back({Side::kPieces, "pieces", {}});
      sides.push_back({Side::kPiecesHashed, "pieces_hashed", {}});
    }
    for (int r = 0; r < repeat; ++r) {
      for (Timed& timed : sides) {
        std::optional<uint64_t> sum;
        timed.gb_per_s.push_back(size / 1e9 /
                                 Run(source, object, chunk, piece, threads, timed.side, &sum));
        if (sum.has_value() && *sum != expected) {
          Die(std::string("a run's checksum (") + timed.name + ") differs from the object's");
        }
      }
    }
    const double copies = Median(sides[0].gb_per_s);
    std::string line = absl::StrFormat("%d thread(s): copies %.2f GB/s", threads, copies);
    nlohmann::json run = {{"threads", threads}};
    for (const Timed& timed : sides) {
      const double median = Median(timed.gb_per_s);
      run[timed.name] = {{"gb_per_s", timed.gb_per_s},
                         {"median_gb_per_s", median},
                         {"over_copies", median / copies}};
      if (timed.side != Side::kCopies) {
        absl::StrAppendFormat(&line, ", %s %.2f (%.3f)", timed.name, median, median / copies);
      }
    }
    std::printf("%s\n", line.c_str());
    runs.push_back(run);
  }
  result["runs"] = runs;
  if (const std::string json = absl::GetFlag(FLAGS_json); !json.empty()) {
    std::ofstream(json) << result.dump(2) << "\n";
  }
  return 0;
}
