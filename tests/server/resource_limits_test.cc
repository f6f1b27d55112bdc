// The bounds on tierd's size and count flags (server/resource_limits.h), on made-up machines.
#include "server/resource_limits.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

// A 2-core machine with 24 GiB available and 12 GiB free in /dev/shm.
MachineResources SmallMachine() {
  MachineResources machine;
  machine.cpu_cores = 2;
  machine.memory_available_bytes = 24 * kGiB;
  machine.shared_memory_free_bytes = 12 * kGiB;
  return machine;
}

// tierd's defaults: 4 GiB host cache, 2 GiB pool, 2 reader threads (what --reader-threads=auto
// gives a 2-core machine; the daemon sizes them before it checks) of 16 x 4 MiB, 256 MiB handoff
// buffer.
DaemonOptions Defaults() {
  DaemonOptions options;
  options.reader.threads = 2;
  options.host_cache_bytes = 4 * kGiB;
  options.gpu_pool_bytes = 2 * kGiB;
  options.session_limits.max_leases = 4096;
  return options;
}

// INVALID_ARGUMENT whose message holds `text`.
::testing::Matcher<absl::Status> RefusedWith(const std::string& text) {
  return ::testing::AllOf(StatusIs(absl::StatusCode::kInvalidArgument),
                          ::testing::Property(&absl::Status::message, HasSubstr(text)));
}

TEST(ResourceLimitsTest, TheDefaultsFitASmallMachine) {
  EXPECT_THAT(CheckDaemonLimits(Defaults(), SmallMachine()), IsOk());
  EXPECT_THAT(CheckStagingMemory(Defaults(), SmallMachine(), "host", 12 * kGiB), IsOk());
  EXPECT_THAT(CheckStagingMemory(Defaults(), SmallMachine(), "cuda", 3 * kGiB), IsOk());
}

TEST(ResourceLimitsTest, ReaderThreadsAreBoundedByFourPerCore) {
  DaemonOptions options = Defaults();
  options.reader.threads = 8;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()), IsOk());
  options.reader.threads = 9;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--reader-threads=9 is more than 4 x 2 cores (8)"));
  options.reader.threads = 100000;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--reader-threads=100000 is more than 4 x 2 cores (8)"));
  MachineResources big = SmallMachine();
  big.cpu_cores = 64;
  options.reader.threads = 200;
  EXPECT_THAT(CheckDaemonLimits(options, big), IsOk());
  options.reader.threads = 0;
  EXPECT_THAT(CheckDaemonLimits(options, big), RefusedWith("--reader-threads=0 is less than 1"));
}

TEST(ResourceLimitsTest, PinThreadsAreBoundedByTheCores) {
  DaemonOptions options = Defaults();
  options.pin_threads = 2;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()), IsOk());
  options.pin_threads = 3;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--pin-threads=3 is not within 0..2"));
  options.pin_threads = -1;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--pin-threads=-1 is not within 0..2"));
}

TEST(ResourceLimitsTest, ReaderQueueDepthAndChunkSizeHaveFixedRanges) {
  DaemonOptions options = Defaults();
  options.reader.queue_depth = 4096;
  options.reader.chunk_bytes = 64 << 10;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()), IsOk());
  options.reader.queue_depth = 4097;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--reader-queue-depth=4097 is not within 1..4096"));
  options.reader.queue_depth = 0;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--reader-queue-depth=0 is not within 1..4096"));
  options.reader.queue_depth = 16;
  for (const uint64_t bad : {uint64_t{0}, uint64_t{1000}, uint64_t{6} << 10, 2 * kGiB}) {
    options.reader.chunk_bytes = bad;
    EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
                RefusedWith("is not a multiple of 4 KiB from 4 KiB to 1 GiB"))
        << bad;
  }
  options.reader.chunk_bytes = kGiB;
  options.reader.queue_depth = 1;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()), IsOk());
}

TEST(ResourceLimitsTest, SessionCountsHaveUpperBounds) {
  DaemonOptions options = Defaults();
  options.max_sessions = kMaxSessions;
  options.session_limits.max_leases = kMaxSessionLeases;
  options.session_max_requests = kMaxSessionRequests;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()), IsOk());
  options.max_sessions = 16385;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--max-sessions=16385 is more than 16384"));
  options.max_sessions = 1024;
  options.session_limits.max_leases = 4000000000u;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--session-max-leases=4000000000 is more than 65536"));
  options.session_limits.max_leases = 4096;
  options.session_max_requests = 65537;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--session-max-requests=65537 is more than 65536"));
}

TEST(ResourceLimitsTest, HostMemoryMustFitInMemAvailable) {
  DaemonOptions options = Defaults();
  options.host_cache_bytes = 25 * kGiB;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--host-cache-bytes=25 GiB is more than the memory available (24 GiB, "
                          "MemAvailable in /proc/meminfo)"));
  // The reader's buffers and the handoff buffer count beside the host cache.
  options.host_cache_bytes = 24 * kGiB - 300 * kMiB;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("--peer-host-buffer-bytes=256 MiB is more than the memory available (24 "
                          "GiB, MemAvailable in /proc/meminfo) less --host-cache-bytes, the disk "
                          "reader's buffers (172 MiB left)"));
  options.host_cache_bytes = 17 * kGiB;
  options.reader.threads = 8;
  options.reader.queue_depth = 1024;
  options.reader.chunk_bytes = 1 * kMiB;
  EXPECT_THAT(CheckDaemonLimits(options, SmallMachine()),
              RefusedWith("the disk reader's buffers, --reader-threads x --reader-queue-depth x "
                          "--reader-chunk-bytes = 8 x 1024 x 1 MiB = 8 GiB, is more than the "
                          "memory available"));
}

TEST(ResourceLimitsTest, ThePeerHandoffBufferMustFitInDevShm) {
  DaemonOptions options = Defaults();
  options.peer_host_buffer_bytes = 13 * kGiB;
  MachineResources machine = SmallMachine();
  machine.memory_available_bytes = 100 * kGiB;
  EXPECT_THAT(CheckDaemonLimits(options, machine),
              RefusedWith("--peer-host-buffer-bytes=13 GiB is more than the free space of /dev/shm "
                          "(12 GiB)"));
}

// What would fit in /dev/shm were other processes not holding part of it (a daemon that died is
// mapped by its peers until their copies from it are done) is refused as UNAVAILABLE, which a
// restart may get past, not as a usage error, which systemd never retries.
TEST(ResourceLimitsTest, DevShmHeldByOthersNowIsUnavailableNotAUsageError) {
  DaemonOptions options = Defaults();
  options.peer_sockets = {"/run/tierd/gpu0.sock", "/run/tierd/gpu1.sock"};  // a shared arena
  options.node_host_tier = true;
  MachineResources machine = SmallMachine();
  machine.shared_memory_total_bytes = 16 * kGiB;
  machine.shared_memory_free_bytes = 3 * kGiB;
  const absl::Status held = CheckDaemonLimits(options, machine);
  EXPECT_THAT(held, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(held.message()), ::testing::HasSubstr("try again"));
  // More than /dev/shm holds at all: a usage error.
  options.host_cache_bytes = 20 * kGiB;
  machine.memory_available_bytes = 100 * kGiB;
  EXPECT_THAT(CheckDaemonLimits(options, machine), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ResourceLimitsTest, HostBackendPoolsMustFitInDevShmAndInMemory) {
  DaemonOptions options = Defaults();
  options.gpu_pool_bytes = 12 * kGiB;
  EXPECT_THAT(CheckStagingMemory(options, SmallMachine(), "host", 12 * kGiB),
              RefusedWith("--gpu-pool-bytes=12 GiB is more than the free space of /dev/shm (12 "
                          "GiB) less --peer-host-buffer-bytes (11.75 GiB left)"));
  options.gpu_pool_bytes = 1 * kGiB;
  options.client_groups = {{"a", "users", 4 * kGiB}, {"big", "users", 7 * kGiB}};
  EXPECT_THAT(CheckStagingMemory(options, SmallMachine(), "host", 12 * kGiB),
              RefusedWith("--client-groups big:7 GiB is more than the free space of /dev/shm (12 "
                          "GiB) less --peer-host-buffer-bytes, --gpu-pool-bytes, --client-groups "
                          "a:4 GiB (6.75 GiB left)"));
  // Shared memory is memory: room in /dev/shm is not enough when MemAvailable is smaller.
  options.client_groups = {{"a", "users", 4 * kGiB}};
  MachineResources tight = SmallMachine();
  tight.memory_available_bytes = 8 * kGiB;
  EXPECT_THAT(CheckStagingMemory(options, tight, "host", 12 * kGiB),
              RefusedWith("--client-groups a:4 GiB is more than the memory available (8 GiB"));
}

TEST(ResourceLimitsTest, CudaPoolsMustFitInTheGpusFreeMemory) {
  DaemonOptions options = Defaults();
  options.gpu_pool_bytes = 70 * kGiB;
  // Host memory and /dev/shm do not bound GPU memory.
  EXPECT_THAT(CheckStagingMemory(options, SmallMachine(), "cuda", 79 * kGiB), IsOk());
  options.client_groups = {{"tenant", "users", 10 * kGiB}};
  EXPECT_THAT(CheckStagingMemory(options, SmallMachine(), "cuda", 79 * kGiB),
              RefusedWith("--client-groups tenant:10 GiB is more than the free memory of the GPU "
                          "(79 GiB) less --gpu-pool-bytes (9 GiB left)"));
  options.client_groups.clear();
  EXPECT_THAT(CheckStagingMemory(options, SmallMachine(), "cuda", 60 * kGiB),
              RefusedWith("--gpu-pool-bytes=70 GiB is more than the free memory of the GPU (60 "
                          "GiB)"));
}

TEST(ResourceLimitsTest, ThisMachinesFiguresAreRead) {
  absl::StatusOr<MachineResources> machine = ReadMachineResources();
  ASSERT_THAT(machine, IsOk());
  EXPECT_GE(machine->cpu_cores, 1);
  EXPECT_GT(machine->memory_available_bytes, 0u);
  EXPECT_GT(machine->shared_memory_free_bytes, 0u);
}

}  // namespace
}  // namespace tierd
