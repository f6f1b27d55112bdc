// Bounds on the flags that size what the daemon allocates, checked before it allocates anything. A
// count past its bound or a budget past what the machine has would otherwise take the machine
// down rather than fail: --reader-threads=100000 grew a daemon to 22 GB that no longer answered
// SIGTERM, and a client group's pool larger than /dev/shm filled it until the OOM killer chose
// other processes.
//
// Daemon::Create calls CheckDaemonLimits before it creates anything and CheckStagingMemory once
// the device exists, before the host cache and the staging pools are allocated. The machine's
// figures are parameters, so tests give their own. Every error is INVALID_ARGUMENT (tierd exits
// 2) naming the flag, its value and the bound.
#ifndef TIERD_SERVER_RESOURCE_LIMITS_H_
#define TIERD_SERVER_RESOURCE_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/daemon_options.h"

namespace tierd {

// Bounds that do not depend on the machine (docs/CONFIGURATION.md's flag table lists them).
inline constexpr int kMaxReaderThreadsPerCore = 4;         // --reader-threads
inline constexpr int kMaxReaderQueueDepth = 4096;          // --reader-queue-depth
inline constexpr uint64_t kReaderChunkAlignment = 4096;    // --reader-chunk-bytes: a multiple,
inline constexpr uint64_t kMaxReaderChunkBytes = 1 << 30;  // from 4 KiB to 1 GiB
inline constexpr uint32_t kMaxSessions = 16384;            // --max-sessions
inline constexpr uint32_t kMaxSessionLeases = 65536;       // --session-max-leases
inline constexpr uint32_t kMaxSessionRequests = 65536;     // --session-max-requests
inline constexpr uint32_t kMaxEvents = 65536;              // --max-events
inline constexpr uint32_t kMaxSessionDoneEvents = 64;      // --session-done-events

// What the machine has, as the checks see it.
struct MachineResources {
  int cpu_cores = 0;                      // CPUs this process may run on
  uint64_t memory_available_bytes = 0;    // MemAvailable in /proc/meminfo
  uint64_t shared_memory_free_bytes = 0;  // free space of /dev/shm
  // Its size: what is not free of it other processes hold now, and may let go of (0: unknown).
  uint64_t shared_memory_total_bytes = 0;
};

// This machine's figures: the CPUs of this process's affinity mask, /proc/meminfo's MemAvailable
// and statvfs of /dev/shm. Errors: FAILED_PRECONDITION when /proc/meminfo has no MemAvailable;
// the errors of reading it or of statvfs.
absl::StatusOr<MachineResources> ReadMachineResources();

// The counts and the memory every daemon takes whatever its device:
//   --reader-threads 1..4 x cores; --pin-threads 0..cores; --reader-queue-depth 1..4096;
//   --reader-chunk-bytes a multiple of 4 KiB from 4 KiB to 1 GiB; --max-sessions up to 16384;
//   --session-max-leases, --session-max-requests and --max-events up to 65536;
//   --session-done-events up to 64;
//   --host-cache-bytes, the disk reader's buffers (threads x queue depth x chunk) and
//   --peer-host-buffer-bytes together within MemAvailable;
//   --peer-host-buffer-bytes (shared memory on both backends) within the free space of /dev/shm.
// Errors: INVALID_ARGUMENT (a usage error: what the flags ask for cannot be had), except where
// they would fit in /dev/shm's size but not in what is free of it now: UNAVAILABLE, as the space
// others hold may come back (a daemon that died is unmapped by its peers once their copies are
// done).
// REQUIRES: --reader-threads=auto has been sized (options.reader.threads is not 0).
absl::Status CheckDaemonLimits(const DaemonOptions& options, const MachineResources& machine);

// The staging pools, --gpu-pool-bytes and each client group's, together within the free memory
// of the device (`device_free_bytes`, from Device::FreeMemoryBytes). On the host backend
// (`backend` "host") they are shared memory: within the free space of /dev/shm beside
// --peer-host-buffer-bytes, and within MemAvailable beside what CheckDaemonLimits counted.
// REQUIRES: CheckDaemonLimits(options, machine) is OK.
absl::Status CheckStagingMemory(const DaemonOptions& options, const MachineResources& machine,
                                absl::string_view backend, uint64_t device_free_bytes);

}  // namespace tierd

#endif  // TIERD_SERVER_RESOURCE_LIMITS_H_
