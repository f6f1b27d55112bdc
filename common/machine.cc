#include "common/machine.h"

#include <sched.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/posix_error.h"

namespace tierd {

int UsableCpus() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus < 1) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus < 1 ? 1 : cpus;
}

absl::StatusOr<uint64_t> AvailableMemoryBytes() {
  constexpr char kMeminfo[] = "/proc/meminfo";
  std::ifstream meminfo(kMeminfo);
  if (!meminfo) return PosixError(absl::StrCat("opening ", kMeminfo), errno);
  for (std::string line; std::getline(meminfo, line);) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "MemAvailable:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    uint64_t kib = 0;
    if (!absl::ConsumeSuffix(&rest, "kB") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) {
      return absl::FailedPreconditionError(absl::StrCat("cannot read ", kMeminfo, ": ", line));
    }
    return kib << 10;
  }
  return absl::FailedPreconditionError(absl::StrCat("no MemAvailable in ", kMeminfo));
}

}  // namespace tierd
