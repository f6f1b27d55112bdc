#include "bench/bench_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tierd::bench {

void Die(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, message.c_str());
  std::exit(1);
}

bool DropPageCache() {
  ::sync();
  std::ofstream out("/proc/sys/vm/drop_caches");
  out << "3\n";
  out.flush();
  if (out) return true;
  static bool warned = false;
  if (!warned) {
    std::fprintf(stderr, "warning: cannot drop the page cache (not root?): cold runs are not cold\n");
    warned = true;
  }
  return false;
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

double Percentile(std::vector<double> values, double fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(fraction * static_cast<double>(values.size()));
  const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return values[std::min(index, values.size() - 1)];
}

std::string TodayUtc() { return absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone()); }

}  // namespace tierd::bench
