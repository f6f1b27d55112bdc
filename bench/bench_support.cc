#include "bench/bench_support.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fd_io.h"
#include "common/posix_error.h"
#include "common/status_macros.h"

namespace tierd::bench {

void Die(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, message.c_str());
  std::exit(1);
}

void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

void Progress(const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }

bool DropPageCache() {
  ::sync();
  std::ofstream out("/proc/sys/vm/drop_caches");
  out << "3\n";
  out.flush();
  if (out) return true;
  static bool warned = false;
  if (!warned) {
    std::fprintf(stderr,
                 "warning: cannot drop the page cache (not root?): cold runs are not cold\n");
    warned = true;
  }
  return false;
}

std::optional<uint64_t> DeviceBytesRead(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0 || major(info.st_dev) == 0) return std::nullopt;
  std::ifstream in(
      absl::StrCat("/sys/dev/block/", major(info.st_dev), ":", minor(info.st_dev), "/stat"));
  uint64_t reads = 0, merged = 0, sectors = 0;
  if (!(in >> reads >> merged >> sectors)) return std::nullopt;
  return sectors * 512;  // the kernel counts 512-byte sectors whatever the device's block size
}

double RunFio(const FioRead& read, nlohmann::json* raw) {
  if (read.files.empty()) Die("fio: no files to read");
  char output[] = "/tmp/tierd-bench-fio-XXXXXX";
  const int fd = ::mkstemp(output);
  if (fd < 0) Die("fio: cannot create a temporary file");
  ::close(fd);
  std::vector<std::string> args = {read.fio,
                                   "--name=reference",
                                   absl::StrCat("--filename=", absl::StrJoin(read.files, ":")),
                                   "--rw=read",
                                   absl::StrCat("--bs=", read.block_bytes),
                                   absl::StrCat("--iodepth=", read.queue_depth),
                                   "--ioengine=io_uring",
                                   "--fixedbufs=1",
                                   "--direct=1",
                                   absl::StrCat("--numjobs=", read.jobs),
                                   "--group_reporting=1",
                                   "--output-format=json",
                                   absl::StrCat("--output=", output)};
  if (read.bytes_per_job > 0) {
    args.push_back(absl::StrCat("--size=", read.bytes_per_job));
    args.push_back(absl::StrCat("--offset_increment=", read.bytes_per_job));
  } else if (read.files.size() > 1) {
    // Every file whole, one after another, as a loader reads them.
    args.push_back("--file_service_type=sequential");
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execvp(argv[0], argv.data());
    std::perror("exec fio");
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("fio failed: " + absl::StrJoin(args, " "));
  }
  std::ifstream in(output);
  nlohmann::json result = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ::unlink(output);
  if (result.is_discarded()) Die("cannot parse fio's output");
  const nlohmann::json& job = result["jobs"][0]["read"];
  if (raw != nullptr) *raw = job;
  return job["bw_bytes"].get<double>() / 1e9;
}

std::vector<int> ParseThreadCounts(const std::vector<std::string>& texts, const std::string& flag,
                                   bool required) {
  std::vector<int> counts;
  for (const std::string& text : texts) {
    int count = 0;
    if (!absl::SimpleAtoi(text, &count) || count < 1 || count > 256) {
      Die(absl::StrCat("--", flag, ": \"", text, "\" is not a count from 1 to 256"));
    }
    counts.push_back(count);
  }
  if (counts.empty() && required) Die(absl::StrCat("--", flag, " names no count"));
  return counts;
}

double Percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  return PercentileOfSorted(values, fraction);
}

double PercentileOfSorted(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(fraction * static_cast<double>(sorted.size()));
  const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

nlohmann::json LatencySummary(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return nlohmann::json{{"count", us.size()},
                        {"p50_us", PercentileOfSorted(us, 0.50)},
                        {"p90_us", PercentileOfSorted(us, 0.90)},
                        {"p99_us", PercentileOfSorted(us, 0.99)},
                        {"p999_us", PercentileOfSorted(us, 0.999)},
                        {"max_us", PercentileOfSorted(us, 1.0)}};
}

absl::StatusOr<double> ProcessCpuSeconds(int pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream in(path);
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && stat.empty()) return absl::NotFoundError(absl::StrCat("no process ", pid));
  // The command name (field 2) is in parentheses and may hold spaces; fields 14 and 15 (utime,
  // stime, in clock ticks) are the 12th and 13th after its closing one.
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) return absl::InternalError(path + " does not parse");
  std::vector<std::string> fields =
      absl::StrSplit(absl::string_view(stat).substr(name_end + 1), ' ', absl::SkipEmpty());
  uint64_t user = 0, system = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &user) ||
      !absl::SimpleAtoi(fields[12], &system)) {
    return absl::InternalError(path + " does not parse");
  }
  return static_cast<double>(user + system) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

namespace {

// Each thread's totals so far, by thread id. NOT_FOUND as ProcessScheduling.
absl::StatusOr<std::map<int, SchedulingTotals>> ThreadScheduling(int pid) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  std::error_code error;
  std::filesystem::directory_iterator threads(tasks, error);
  if (error) return absl::NotFoundError(absl::StrCat(tasks, ": ", error.message()));
  std::map<int, SchedulingTotals> totals;
  for (const std::filesystem::directory_entry& thread : threads) {
    int id = 0;
    if (!absl::SimpleAtoi(thread.path().filename().string(), &id)) continue;
    // "on-CPU ns, waiting ns, timeslices" (Documentation/scheduler/sched-stats.rst).
    std::ifstream in(thread.path() / "schedstat");
    uint64_t on_cpu_ns = 0, waiting_ns = 0, timeslices = 0;
    if (!(in >> on_cpu_ns >> waiting_ns >> timeslices)) continue;  // ended, or no schedstat
    totals[id] = {static_cast<double>(on_cpu_ns) / 1e9, static_cast<double>(waiting_ns) / 1e9,
                  timeslices};
  }
  if (totals.empty()) return absl::NotFoundError(absl::StrCat("no schedstat under ", tasks));
  return totals;
}

}  // namespace

absl::StatusOr<SchedulingTotals> ProcessScheduling(int pid) {
  ASSIGN_OR_RETURN(const auto threads, ThreadScheduling(pid));
  SchedulingTotals sum;
  for (const auto& [id, totals] : threads) sum.Add(totals);
  return sum;
}

SchedulingSampler::SchedulingSampler(int pid, absl::Duration period) : pid_(pid) {
  absl::StatusOr<std::map<int, SchedulingTotals>> threads = ThreadScheduling(pid);
  if (!threads.ok()) return;
  {
    absl::MutexLock lock(&mu_);
    read_at_start_ = true;
    for (const auto& [id, totals] : *threads) threads_[id] = {totals, totals};
  }
  sampler_ = std::thread([this, period] {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) {
      mu_.Unlock();
      Sample();
      mu_.Lock();
    }
  });
}

SchedulingSampler::~SchedulingSampler() { Stop(); }

void SchedulingSampler::Sample() {
  absl::StatusOr<std::map<int, SchedulingTotals>> threads = ThreadScheduling(pid_);
  if (!threads.ok()) return;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, totals] : *threads) {
    auto [it, inserted] = threads_.try_emplace(id, SchedulingTotals{}, totals);
    if (!inserted) it->second.second = totals;
  }
}

std::optional<SchedulingTotals> SchedulingSampler::Stop() {
  if (sampler_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    sampler_.join();
    Sample();
  }
  absl::MutexLock lock(&mu_);
  if (!read_at_start_) return std::nullopt;
  SchedulingTotals sum;
  for (const auto& [id, first_and_last] : threads_) {
    sum.Add(first_and_last.second.Since(first_and_last.first));
  }
  return sum;
}

absl::StatusOr<MachineCpuTimes> ReadMachineCpuTimes() {
  std::ifstream in("/proc/stat");
  std::string label;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(in >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) ||
      label != "cpu") {
    return absl::NotFoundError("/proc/stat has no cpu line");
  }
  const double tick = 1.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  MachineCpuTimes times;
  times.user = static_cast<double>(user + nice) * tick;
  times.system = static_cast<double>(system) * tick;
  times.idle = static_cast<double>(idle + iowait) * tick;
  times.interrupts = static_cast<double>(irq + softirq) * tick;
  times.steal = static_cast<double>(steal) * tick;
  return times;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("ended with wait status ", status);
}

std::string TodayUtc() { return absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone()); }

void FillRandomWords(std::vector<uint64_t>& words, uint64_t& seed) {
  for (uint64_t& word : words) {
    uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    word = z ^ (z >> 31);
  }
}

absl::StatusOr<double> PreadFiles(const std::vector<std::string>& files, uint8_t* destination,
                                  uint64_t capacity, int threads, uint64_t read_bytes) {
  return PreadFiles(files, destination, capacity, threads, read_bytes, nullptr);
}

absl::StatusOr<double> PreadFiles(const std::vector<std::string>& files, uint8_t* destination,
                                  uint64_t capacity, int threads, uint64_t read_bytes,
                                  const AfterRead& after_read) {
  // The files back to back: file f's bytes land at file_start[f].
  std::vector<uint64_t> file_start = {0};
  std::vector<ScopedFd> fds;
  for (const std::string& path : files) {
    fds.emplace_back(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fds.back().get() < 0) return PosixError("cannot open " + path, errno);
    struct stat st;
    if (::fstat(fds.back().get(), &st) != 0) return PosixError("cannot stat " + path, errno);
    file_start.push_back(file_start.back() + static_cast<uint64_t>(st.st_size));
  }
  const uint64_t total = file_start.back();
  if (total > capacity) {
    return absl::OutOfRangeError(absl::StrCat("the files hold ", total, " bytes, more than the ",
                                              capacity, " the destination has room for"));
  }
  absl::Mutex mu;
  absl::Status first_error;
  auto note = [&](absl::Status error) {
    absl::MutexLock lock(&mu);
    first_error.Update(std::move(error));
  };
  // Reads [begin, end) of the files back to back.
  auto read_share = [&](int thread, uint64_t begin, uint64_t end) {
    for (uint64_t position = begin; position < end;) {
      const size_t f =
          static_cast<size_t>(std::upper_bound(file_start.begin(), file_start.end(), position) -
                              file_start.begin() - 1);
      const uint64_t n = std::min({read_bytes, end - position, file_start[f + 1] - position});
      const ssize_t got = ::pread(fds[f].get(), destination + position, n,
                                  static_cast<off_t>(position - file_start[f]));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        note(got == 0 ? absl::DataLossError(files[f] + " ended early")
                      : PosixError("reading " + files[f], errno));
        return;
      }
      if (after_read != nullptr) {
        if (absl::Status status = after_read(thread, position, static_cast<uint64_t>(got));
            !status.ok()) {
          note(std::move(status));
          return;
        }
      }
      position += static_cast<uint64_t>(got);
    }
  };
  threads = std::max(threads, 1);
  const uint64_t share = (total / threads + read_bytes - 1) / read_bytes * read_bytes;
  std::vector<std::thread> readers;
  const Clock::time_point start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    const uint64_t begin = std::min(total, share * t);
    const uint64_t end = t == threads - 1 ? total : std::min(total, share * (t + 1));
    readers.emplace_back(read_share, t, begin, end);
  }
  for (std::thread& reader : readers) reader.join();
  const double seconds = SecondsSince(start);
  if (!first_error.ok()) return first_error;
  return seconds;
}

}  // namespace tierd::bench
