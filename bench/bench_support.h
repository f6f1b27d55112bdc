// What the benchmarks share: fio as the reference disk reader, dropping the page cache, and
// summary statistics. Benchmarks exit with a message on any failure (Die).
#ifndef TIERD_BENCH_BENCH_SUPPORT_H_
#define TIERD_BENCH_BENCH_SUPPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tierd::bench {

// Prints "PROGRAM: message" to stderr and exits 1.
[[noreturn]] void Die(const std::string& message);

// Writes dirty pages back and drops the page cache. Needs root; returns false (after a warning
// on the first failure) where it cannot.
bool DropPageCache();

// A sequential O_DIRECT read of `files` (one after another, as one job each with --numjobs=1, or
// split across jobs) through fio's io_uring engine with fixed buffers.
struct FioRead {
  std::string fio = "fio";
  std::vector<std::string> files;
  uint64_t block_bytes = 4ull << 20;
  int queue_depth = 32;
  int jobs = 1;
  // Per job, when `files` holds one file split across jobs; 0: whole files.
  uint64_t bytes_per_job = 0;
};

// Runs fio and returns the read throughput in GB/s; `raw` (optional) gets fio's "read" object.
double RunFio(const FioRead& read, nlohmann::json* raw = nullptr);

// The value below which `fraction` (0..1) of `values` lie (nearest rank).
double Percentile(std::vector<double> values, double fraction);
inline double Median(std::vector<double> values) { return Percentile(std::move(values), 0.5); }

// Today's date, YYYY-MM-DD (UTC), for the records.
std::string TodayUtc();

}  // namespace tierd::bench

#endif  // TIERD_BENCH_BENCH_SUPPORT_H_
