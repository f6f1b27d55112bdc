#include "common/cpus.h"

#include <sched.h>

#include <thread>

namespace tierd {

int UsableCpus() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus < 1) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus < 1 ? 1 : cpus;
}

}  // namespace tierd
