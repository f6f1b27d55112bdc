#include "server/resource_limits.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/machine.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "device/shared_memory.h"

namespace tierd {
namespace {

// One resource shared out among flags in turn: each takes its share of what the earlier ones
// left, or is refused naming itself, the resource and the earlier takers.
class Budget {
 public:
  Budget(uint64_t bytes, std::string description)
      : left_(bytes), description_(std::move(description)) {}

  // `taker` as the error names it ("--host-cache-bytes=4 GiB"), `name` as later errors list it.
  absl::Status Take(absl::string_view taker, absl::string_view name, uint64_t bytes) {
    if (bytes > left_) {
      std::string message = absl::StrCat(taker, " is more than ", description_);
      if (!takers_.empty()) {
        absl::StrAppend(&message, " less ", absl::StrJoin(takers_, ", "), " (",
                        FormatByteSize(left_), " left)");
      }
      return absl::InvalidArgumentError(message);
    }
    left_ -= bytes;
    takers_.emplace_back(name);
    return absl::OkStatus();
  }

 private:
  uint64_t left_;
  const std::string description_;
  std::vector<std::string> takers_;
};

Budget MemoryAvailable(const MachineResources& machine) {
  return Budget(
      machine.memory_available_bytes,
      absl::StrCat("the memory available (", FormatByteSize(machine.memory_available_bytes),
                   ", MemAvailable in /proc/meminfo)"));
}

Budget SharedMemoryFree(uint64_t free_bytes) {
  return Budget(free_bytes,
                absl::StrCat("the free space of /dev/shm (", FormatByteSize(free_bytes), ")"));
}

// A refusal of /dev/shm's space made UNAVAILABLE when everything asked of it, `asked`, fits in
// its size: only what other processes hold now stands in the way, and that may come back (a
// restart in a moment may succeed, where a usage error would never be retried).
absl::Status TransientIfItFits(absl::Status refused, uint64_t asked,
                               const MachineResources& machine) {
  if (refused.ok() || machine.shared_memory_total_bytes == 0 ||
      asked > machine.shared_memory_total_bytes) {
    return refused;
  }
  return absl::UnavailableError(absl::StrCat(
      refused.message(), "; /dev/shm holds ", FormatByteSize(machine.shared_memory_total_bytes),
      ", the rest is held by other processes now (the peers of a daemon that died map its arena "
      "until their copies from it are done): try again"));
}

std::string Sized(absl::string_view flag, uint64_t bytes) {
  return absl::StrCat(flag, "=", FormatByteSize(bytes));
}

// `a * b`, or UINT64_MAX when that does not fit.
uint64_t SaturatingMultiply(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? UINT64_MAX : product;
}

uint64_t ReaderBufferBytes(const DiskReaderOptions& reader) {
  return SaturatingMultiply(
      SaturatingMultiply(static_cast<uint64_t>(reader.threads), reader.queue_depth),
      reader.chunk_bytes);
}

absl::Status CheckCounts(const DaemonOptions& options, const MachineResources& machine) {
  const DiskReaderOptions& reader = options.reader;
  const int max_threads = kMaxReaderThreadsPerCore * machine.cpu_cores;
  if (reader.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--reader-threads=", reader.threads, " is less than 1"));
  }
  if (reader.threads > max_threads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--reader-threads=", reader.threads, " is more than ", kMaxReaderThreadsPerCore, " x ",
        machine.cpu_cores, " cores (", max_threads, ")"));
  }
  if (options.pin_threads < 0 || options.pin_threads > machine.cpu_cores) {
    return absl::InvalidArgumentError(absl::StrCat("--pin-threads=", options.pin_threads,
                                                   " is not within 0..", machine.cpu_cores,
                                                   " (the cores; 0 picks half of them)"));
  }
  if (reader.queue_depth < 1 || reader.queue_depth > kMaxReaderQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat("--reader-queue-depth=", reader.queue_depth,
                                                   " is not within 1..", kMaxReaderQueueDepth));
  }
  if (reader.chunk_bytes < kReaderChunkAlignment || reader.chunk_bytes > kMaxReaderChunkBytes ||
      reader.chunk_bytes % kReaderChunkAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sized("--reader-chunk-bytes", reader.chunk_bytes), " is not a multiple of ",
        FormatByteSize(kReaderChunkAlignment), " from ", FormatByteSize(kReaderChunkAlignment),
        " to ", FormatByteSize(kMaxReaderChunkBytes)));
  }
  const std::pair<const char*, std::pair<uint32_t, uint32_t>> bounded[] = {
      {"--max-sessions", {options.max_sessions, kMaxSessions}},
      {"--session-max-leases", {options.session_limits.max_leases, kMaxSessionLeases}},
      {"--session-max-requests", {options.session_max_requests, kMaxSessionRequests}},
      {"--max-events", {options.max_events, kMaxEvents}},
      {"--session-done-events", {options.session_done_events, kMaxSessionDoneEvents}},
  };
  for (const auto& [flag, value_and_bound] : bounded) {
    const auto [value, bound] = value_and_bound;
    if (value > bound) {
      return absl::InvalidArgumentError(absl::StrCat(flag, "=", value, " is more than ", bound));
    }
  }
  return absl::OkStatus();
}

// The host memory CheckDaemonLimits counts, taken from `memory`.
absl::Status TakeDaemonHostMemory(const DaemonOptions& options, Budget& memory) {
  RETURN_IF_ERROR(memory.Take(Sized("--host-cache-bytes", options.host_cache_bytes),
                              "--host-cache-bytes", options.host_cache_bytes));
  const DiskReaderOptions& reader = options.reader;
  const uint64_t reader_bytes = ReaderBufferBytes(reader);
  RETURN_IF_ERROR(memory.Take(
      absl::StrCat("the disk reader's buffers, --reader-threads x --reader-queue-depth x "
                   "--reader-chunk-bytes = ",
                   reader.threads, " x ", reader.queue_depth, " x ",
                   FormatByteSize(reader.chunk_bytes), " = ", FormatByteSize(reader_bytes), ","),
      "the disk reader's buffers", reader_bytes));
  return memory.Take(Sized("--peer-host-buffer-bytes", options.peer_host_buffer_bytes),
                     "--peer-host-buffer-bytes", options.peer_host_buffer_bytes);
}

}  // namespace

absl::StatusOr<MachineResources> ReadMachineResources() {
  MachineResources machine;
  machine.cpu_cores = UsableCpus();

  ASSIGN_OR_RETURN(machine.memory_available_bytes, AvailableMemoryBytes());
  ASSIGN_OR_RETURN(machine.shared_memory_free_bytes, SharedMemoryFreeBytes());
  ASSIGN_OR_RETURN(machine.shared_memory_total_bytes, SharedMemoryTotalBytes());
  return machine;
}

absl::Status CheckDaemonLimits(const DaemonOptions& options, const MachineResources& machine) {
  RETURN_IF_ERROR(CheckCounts(options, machine));
  Budget memory = MemoryAvailable(machine);
  RETURN_IF_ERROR(TakeDaemonHostMemory(options, memory));
  Budget shared_memory = SharedMemoryFree(machine.shared_memory_free_bytes);
  uint64_t asked = options.peer_host_buffer_bytes;
  if (SharesHostTier(options)) {
    asked += options.host_cache_bytes;
    RETURN_IF_ERROR(TransientIfItFits(
        shared_memory.Take(absl::StrCat(Sized("--host-cache-bytes", options.host_cache_bytes),
                                        " (a shared host arena: --peers with --node-host-tier)"),
                           "--host-cache-bytes", options.host_cache_bytes),
        asked, machine));
  }
  return TransientIfItFits(
      shared_memory.Take(Sized("--peer-host-buffer-bytes", options.peer_host_buffer_bytes),
                         "--peer-host-buffer-bytes", options.peer_host_buffer_bytes),
      asked, machine);
}

absl::Status CheckStagingMemory(const DaemonOptions& options, const MachineResources& machine,
                                absl::string_view backend, uint64_t device_free_bytes) {
  const bool host_backend = backend == "host";
  // On the host backend the device's memory is /dev/shm, which the peer handoff buffer shares.
  Budget device = host_backend ? SharedMemoryFree(device_free_bytes)
                               : Budget(device_free_bytes,
                                        absl::StrCat("the free memory of the GPU (",
                                                     FormatByteSize(device_free_bytes), ")"));
  Budget memory = MemoryAvailable(machine);
  if (host_backend) {
    if (SharesHostTier(options)) {
      RETURN_IF_ERROR(device.Take(Sized("--host-cache-bytes", options.host_cache_bytes),
                                  "--host-cache-bytes", options.host_cache_bytes));
    }
    RETURN_IF_ERROR(device.Take(Sized("--peer-host-buffer-bytes", options.peer_host_buffer_bytes),
                                "--peer-host-buffer-bytes", options.peer_host_buffer_bytes));
    RETURN_IF_ERROR(TakeDaemonHostMemory(options, memory));
  }
  std::vector<std::pair<std::string, uint64_t>> pools = {
      {Sized("--gpu-pool-bytes", options.gpu_pool_bytes), options.gpu_pool_bytes}};
  for (const ClientGroupOptions& group : options.client_groups) {
    pools.emplace_back(
        absl::StrCat("--client-groups ", group.name, ":", FormatByteSize(group.gpu_pool_bytes)),
        group.gpu_pool_bytes);
  }
  for (size_t i = 0; i < pools.size(); ++i) {
    const auto& [taker, bytes] = pools[i];
    const std::string name = i == 0 ? "--gpu-pool-bytes" : taker;
    RETURN_IF_ERROR(device.Take(taker, name, bytes));
    if (host_backend) RETURN_IF_ERROR(memory.Take(taker, name, bytes));
  }
  return absl::OkStatus();
}

}  // namespace tierd
