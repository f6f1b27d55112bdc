// What this machine offers the process, read from the kernel: the CPUs it may run on and the
// memory available. Thread counts that scale with the machine (disk readers, checksum and pinning
// threads) and the budgets checked at start-up all start from here.
#ifndef TIERD_COMMON_MACHINE_H_
#define TIERD_COMMON_MACHINE_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace tierd {

// The CPUs this process may run on: its affinity mask (taskset, a cgroup's cpuset, systemd's
// CPUAffinity), else the machine's count; at least 1.
int UsableCpus();

// MemAvailable in /proc/meminfo, in bytes. Errors: those of opening it; FAILED_PRECONDITION when
// it has no MemAvailable line or the line does not read.
absl::StatusOr<uint64_t> AvailableMemoryBytes();

}  // namespace tierd

#endif  // TIERD_COMMON_MACHINE_H_
