// What the benchmarks share: fio as the reference disk reader, dropping the page cache, timing,
// and summary statistics. Benchmarks exit with a message on any failure (Die, Check).
#ifndef TIERD_BENCH_BENCH_SUPPORT_H_
#define TIERD_BENCH_BENCH_SUPPORT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tierd::bench {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Seconds on CLOCK_MONOTONIC: one clock for every process of the machine, so that times taken in
// several processes compare.
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Prints "PROGRAM: message" to stderr and exits 1.
[[noreturn]] void Die(const std::string& message);

// The value, or Die with "what: status".
void Check(const absl::Status& status, const std::string& what);

// The first error reported from several threads.
class FirstError {
 public:
  void Note(std::string error) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (error_.empty()) error_ = std::move(error);
  }
  // Dies with `what: error` when one was noted. REQUIRES: the threads that note have finished.
  void DieIfAny(const std::string& what) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!error_.empty()) Die(what + ": " + error_);
  }

 private:
  absl::Mutex mu_;
  std::string error_ ABSL_GUARDED_BY(mu_);
};
template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  Check(value.status(), what);
  return *std::move(value);
}

// One line of progress on stderr.
void Progress(const std::string& line);

// Writes dirty pages back and drops the page cache. Needs root; returns false (after a warning
// on the first failure) where it cannot.
bool DropPageCache();

// Bytes the kernel has read from the block device holding `path` since boot (its sectors read, from
// /sys/dev/block/MAJOR:MINOR/stat); nullopt where there is no such device (tmpfs, overlayfs).
// Counts every reader of the device, not only tierd's.
std::optional<uint64_t> DeviceBytesRead(const std::string& path);

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

// Reads `files`, back to back, into `destination` (room for `capacity` bytes) on `threads`
// threads, each a contiguous share of the bytes in reads of `read_bytes` (shares start at multiples
// of it, so every read but those at a file's end is whole): the plain parallel reader the daemon's
// loads are compared with. Returns the seconds from the first read to the last, or the first
// error (a file that cannot be opened or read, or that ends early; OUT_OF_RANGE when the files
// hold more than `capacity` bytes).
absl::StatusOr<double> PreadFiles(const std::vector<std::string>& files, uint8_t* destination,
                                  uint64_t capacity, int threads, uint64_t read_bytes = 4ull << 20);

// PreadFiles, and after each read its thread calls `after_read(thread, position, bytes)` with
// the read's place in `destination` (0 <= thread < threads). The first error it returns ends that
// thread's share and is returned.
using AfterRead = std::function<absl::Status(int thread, uint64_t position, uint64_t bytes)>;
absl::StatusOr<double> PreadFiles(const std::vector<std::string>& files, uint8_t* destination,
                                  uint64_t capacity, int threads, uint64_t read_bytes,
                                  const AfterRead& after_read);

// The thread counts a benchmark's list flag gives (--threads=1,4,8,16): each a count from 1 to
// 256, or Die naming --`flag`. An empty list is none, or with `required` an error too.
std::vector<int> ParseThreadCounts(const std::vector<std::string>& texts, const std::string& flag,
                                   bool required = true);

// The value below which `fraction` (0..1) of `values` lie (nearest rank).
double Percentile(std::vector<double> values, double fraction);
inline double Median(std::vector<double> values) { return Percentile(std::move(values), 0.5); }
// Same, of values sorted ascending (no copy).
double PercentileOfSorted(const std::vector<double>& sorted, double fraction);

// Latencies in microseconds summarised as {count, p50_us, p90_us, p99_us, p999_us, max_us}.
nlohmann::json LatencySummary(std::vector<double> us);

// User + system CPU seconds process `pid` has used so far (/proc/PID/stat). NOT_FOUND when there
// is no such process; INTERNAL when the file does not parse.
absl::StatusOr<double> ProcessCpuSeconds(int pid);

// How the scheduler has treated a process's threads so far, summed over /proc/PID/task/*/schedstat
// (threads that have ended are not counted): time on a CPU, time runnable but waiting for one, and
// how many times one was put on a CPU.
struct SchedulingTotals {
  double on_cpu_s = 0;
  double waiting_s = 0;
  uint64_t timeslices = 0;
  // What was added since `earlier`, a reading of the same threads.
  SchedulingTotals Since(const SchedulingTotals& earlier) const {
    return {on_cpu_s - earlier.on_cpu_s, waiting_s - earlier.waiting_s,
            timeslices - earlier.timeslices};
  }
  // Counts `other`'s threads in too.
  void Add(const SchedulingTotals& other) {
    on_cpu_s += other.on_cpu_s;
    waiting_s += other.waiting_s;
    timeslices += other.timeslices;
  }
};
// NOT_FOUND when there is no such process or the kernel keeps no schedstat.
absl::StatusOr<SchedulingTotals> ProcessScheduling(int pid);

// The same for a process whose threads may end before the span does (a daemon's session threads
// end with their sessions): samples each thread every `period` from construction to Stop and adds
// up each one's change up to its last sample.
class SchedulingSampler {
 public:
  SchedulingSampler(int pid, absl::Duration period);
  ~SchedulingSampler();
  SchedulingSampler(const SchedulingSampler&) = delete;
  SchedulingSampler& operator=(const SchedulingSampler&) = delete;

  // The totals since construction; unset when the process could not be read at the start.
  std::optional<SchedulingTotals> Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Sample() ABSL_LOCKS_EXCLUDED(mu_);

  const int pid_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool read_at_start_ ABSL_GUARDED_BY(mu_) = false;
  // Per thread id: its totals when first seen (zero for a thread started since) and when last.
  std::map<int, std::pair<SchedulingTotals, SchedulingTotals>> threads_ ABSL_GUARDED_BY(mu_);
  std::thread sampler_;
};

// The machine's CPU time so far by kind, in seconds over all CPUs (/proc/stat's "cpu" line).
struct MachineCpuTimes {
  double user = 0;  // with nice
  double system = 0;
  double idle = 0;        // with iowait
  double interrupts = 0;  // irq and softirq
  double steal = 0;       // taken by the hypervisor for others
  double total() const { return user + system + idle + interrupts + steal; }
  MachineCpuTimes Since(const MachineCpuTimes& earlier) const {
    return {user - earlier.user, system - earlier.system, idle - earlier.idle,
            interrupts - earlier.interrupts, steal - earlier.steal};
  }
};
absl::StatusOr<MachineCpuTimes> ReadMachineCpuTimes();

// How a child process ended, from its wait status: "exited 0", "killed by signal 9".
std::string DescribeWaitStatus(int status);

// Today's date, YYYY-MM-DD (UTC), for the records.
std::string TodayUtc();

// Fills `words` with pseudo-random words (splitmix64 from `seed`, which it advances): the bytes of
// the models benchmarks write.
void FillRandomWords(std::vector<uint64_t>& words, uint64_t& seed);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_BENCH_SUPPORT_H_
