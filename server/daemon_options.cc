#include "server/daemon_options.h"

#include <arpa/inet.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu/staging_pool.h"

namespace tierd {
namespace {

// A session's thread polls no longer than this: past it a sleep's wake-up costs little beside it.
constexpr absl::Duration kMaxSessionBusyPoll = absl::Milliseconds(10);
constexpr int kMaxSessionThreads = 64;
// The fewest events a tier is given: a session's done events and a copy's ready event.
constexpr uint32_t kMinEventsPerTier = 8;
// Below this a stream's decode scratch cannot hold one decode's rows; above it, it is device
// memory taken from every copy stream for nothing.
constexpr uint64_t kMinDecodeScratchBytes = 56ull << 20;
constexpr uint64_t kMaxDecodeScratchBytes = 16ull << 30;
constexpr int kMaxCompressThreads = 64;
// Beyond this a stop that waits on clients is a hang, not a grace period.
constexpr absl::Duration kMaxShutdownGrace = absl::Hours(1);

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

bool IsIpAddress(const std::string& text) {
  in6_addr address;
  return ::inet_pton(AF_INET, text.c_str(), &address) == 1 ||
         ::inet_pton(AF_INET6, text.c_str(), &address) == 1;
}

absl::Status ValidateTiers(const DaemonOptions& options) {
  if (options.state_dir.empty()) return Invalid("--state-dir is empty");
  if (options.host_cache_bytes == 0) return Invalid("--host-cache-bytes must be greater than 0");
  if (options.gpu_pool_bytes == 0) return Invalid("--gpu-pool-bytes must be greater than 0");
  if (options.gpu_slab_bytes == 0 || options.gpu_slab_bytes % kStagingAlignment != 0) {
    // Not rounded in silence: the operator would get slabs of a size nobody asked for.
    return Invalid(absl::StrCat("--gpu-slab-bytes must be a positive multiple of ",
                                kStagingAlignment, " bytes, not ", options.gpu_slab_bytes));
  }
  if (options.retain_bytes.has_value() && *options.retain_bytes > options.gpu_pool_bytes) {
    return Invalid(absl::StrCat("--retain-bytes (", *options.retain_bytes,
                                ") must not be more than --gpu-pool-bytes (",
                                options.gpu_pool_bytes, ")"));
  }
  if (options.compress_threads < 1 || options.compress_threads > kMaxCompressThreads) {
    return Invalid(absl::StrCat("--compress-threads must be from 1 to ", kMaxCompressThreads,
                                ", not ", options.compress_threads));
  }
  if (options.decode_scratch_bytes < kMinDecodeScratchBytes ||
      options.decode_scratch_bytes > kMaxDecodeScratchBytes) {
    return Invalid(absl::StrCat("--decode-scratch-mib must be from ", kMinDecodeScratchBytes >> 20,
                                " to ", kMaxDecodeScratchBytes >> 20, ", not ",
                                options.decode_scratch_bytes >> 20));
  }
  if (options.reader.threads < 0) {
    return Invalid("--reader-threads must be auto or a number from 1");
  }
  if (options.max_tensors_per_model == 0) {
    return Invalid("--max-tensors-per-model must be at least 1");
  }
  return absl::OkStatus();
}

absl::Status ValidateSessions(const DaemonOptions& options) {
  if (options.session_limits.max_leases == 0) {
    return Invalid("--session-max-leases must be greater than 0");
  }
  if (options.session_limits.max_staging_bytes == 0) {
    return Invalid("--session-max-staging-bytes must be greater than 0");
  }
  if (options.session_max_requests == 0) {
    return Invalid("--session-max-requests must be greater than 0");
  }
  if (options.session_threads < 0 || options.session_threads > kMaxSessionThreads) {
    return Invalid(
        absl::StrCat("--session-threads must be from 0 (the default) to ", kMaxSessionThreads));
  }
  if (options.session_busy_poll > kMaxSessionBusyPoll) {
    return Invalid(absl::StrCat("--session-busy-poll-us must be at most ",
                                absl::ToInt64Microseconds(kMaxSessionBusyPoll)));
  }
  if (options.max_sessions == 0) return Invalid("--max-sessions must be greater than 0");
  if (EventShare(options) < kMinEventsPerTier) {
    return Invalid(absl::StrCat(
        "--max-events must be at least ", kMinEventsPerTier,
        " per GPU tier: ", kMinEventsPerTier * (1 + options.client_groups.size()),
        " for the default group and ", options.client_groups.size(), " client group(s)"));
  }
  if (options.max_unread_answer_bytes == 0) {
    return Invalid("--max-unread-answer-bytes must be greater than 0");
  }
  if (!options.client_groups.empty() && options.session_socket_path.empty()) {
    return Invalid(
        "--client-groups needs the session socket: their sessions go to sockets beside it");
  }
  if (options.shutdown_grace < absl::ZeroDuration() || options.shutdown_grace > kMaxShutdownGrace) {
    return Invalid(absl::StrCat(
        "--shutdown-grace-ms=", absl::ToInt64Milliseconds(options.shutdown_grace),
        " is not within 0..", absl::ToInt64Milliseconds(kMaxShutdownGrace), " (an hour)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRemote(const RemoteOptions& remote) {
  if (!remote.cache_dir.empty() && remote.endpoint.empty()) {
    return Invalid("--remote-cache-dir caches models from --s3-endpoint; give both");
  }
  if (!remote.ca_file.empty() && ::access(remote.ca_file.c_str(), R_OK) != 0) {
    return Invalid(absl::StrCat("--s3-ca-file ", remote.ca_file, " cannot be read"));
  }
  if (remote.streams < 1 || remote.streams > 1024) {
    return Invalid(absl::StrCat("--remote-streams must be 1 to 1024, not ", remote.streams));
  }
  if (remote.part_bytes < (1u << 20) || remote.part_bytes > (1ull << 30) ||
      remote.part_bytes % (1u << 20) != 0) {
    return Invalid("--remote-part-mib must be 1 to 1024");
  }
  if (remote.host_streams < 0 || remote.host_streams > 65536) {
    return Invalid(
        absl::StrCat("--remote-host-streams must be 0 to 65536, not ", remote.host_streams));
  }
  if (remote.stall_timeout < absl::Seconds(1)) {
    return Invalid("--s3-stall-timeout-ms must be at least 1000");
  }
  if (remote.attempts < 1 || remote.attempts > 100) {
    return Invalid(absl::StrCat("--s3-attempts must be 1 to 100, not ", remote.attempts));
  }
  return absl::OkStatus();
}

absl::Status ValidateNode(const DaemonOptions& options) {
  for (const std::string& peer : options.peer_sockets) {
    if (!absl::StartsWith(peer, "/")) {
      return Invalid(absl::StrCat("--peers: \"", peer, "\" is not an absolute socket path"));
    }
  }
  if (options.node_home_timeout <= absl::ZeroDuration()) {
    return Invalid("--node-home-timeout-ms must be positive");
  }
  return absl::OkStatus();
}

absl::Status ValidateMetrics(const DaemonOptions& options) {
  if (!options.metrics_port.has_value()) {
    // Accepted and ignored, an address would leave an operator believing metrics are served.
    if (!options.metrics_address.empty()) {
      return Invalid(absl::StrCat("--metrics-address ", options.metrics_address,
                                  " needs --metrics-port: without a port nothing is served"));
    }
    return absl::OkStatus();
  }
  if (*options.metrics_port < 0 || *options.metrics_port > 65535) {
    return Invalid("--metrics-port must be 0 (off) or a port, 1..65535");
  }
  if (!options.metrics_address.empty() && !IsIpAddress(options.metrics_address)) {
    return Invalid(absl::StrCat("--metrics-address must be an IPv4 or IPv6 address, not \"",
                                options.metrics_address, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t EventShare(const DaemonOptions& options) {
  return options.max_events / static_cast<uint32_t>(1 + options.client_groups.size());
}

absl::Status ValidateOptions(const DaemonOptions& options) {
  RETURN_IF_ERROR(ValidateTiers(options));
  RETURN_IF_ERROR(ValidateSessions(options));
  RETURN_IF_ERROR(ValidateRemote(options.remote));
  RETURN_IF_ERROR(ValidateNode(options));
  return ValidateMetrics(options);
}

}  // namespace tierd
