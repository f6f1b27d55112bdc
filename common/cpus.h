// The CPUs this process may run on: its affinity mask (taskset, a cgroup's cpuset, systemd's
// CPUAffinity), else the machine's count; at least 1. Thread counts that scale with the machine
// (disk readers, checksum and pinning threads, the limits on flags) all start from it.
#ifndef TIERD_COMMON_CPUS_H_
#define TIERD_COMMON_CPUS_H_

namespace tierd {

int UsableCpus();

}  // namespace tierd

#endif  // TIERD_COMMON_CPUS_H_
