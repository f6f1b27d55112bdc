// tierd: the per-GPU tiered memory daemon. Parses flags (and --config's file), builds
// DaemonOptions, tells systemd when it serves, runs until SIGTERM or SIGINT, then drains and exits
// within a bound.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "common/config_file.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/systemd_notify.h"
#include "device/device_factory.h"
#include "server/daemon.h"
#include "server/unread_answer_budget.h"
#include "wire/session_socket.h"

ABSL_FLAG(std::string, device, "auto",
          "auto, host or cuda:N; auto picks cuda:0 when a GPU is visible");
ABSL_FLAG(std::string, socket, "/run/tierd/gpu0.sock", "Unix socket to serve gRPC on");
ABSL_FLAG(std::string, session_socket, "default",
          "Unix socket serving sessions without gRPC, for the data path's latency; \"default\": "
          "beside --socket (X.sock -> X.session.sock); empty: none");
ABSL_FLAG(std::string, state_dir, "/var/lib/tierd/gpu0", "Directory for persistent state");
ABSL_FLAG(tierd::ByteSize, host_cache_bytes, tierd::ByteSize{4ull << 30},
          "Budget of the pinned host cache, e.g. 64GiB");
ABSL_FLAG(tierd::ByteSize, gpu_pool_bytes, tierd::ByteSize{2ull << 30},
          "Budget of the GPU staging pool, e.g. 8GiB");
ABSL_FLAG(tierd::ByteSize, gpu_slab_bytes, tierd::ByteSize{2ull << 30},
          "The GPU pool is allocated in slabs of this size (one IPC handle each); the largest "
          "object that fits on the GPU");
ABSL_FLAG(std::string, retain_bytes, "half",
          "GPU staging bytes the default group's retained sets may hold: a size, or half (of "
          "--gpu-pool-bytes)");
ABSL_FLAG(uint32_t, session_max_leases, 4096, "Leases one session may hold at once");
ABSL_FLAG(uint32_t, session_max_requests, 1024,
          "Requests one session may have sent and not had answered; one more is refused");
ABSL_FLAG(int, session_threads, 0,
          "Threads serving the session socket's connections, each any number of them; 0: a "
          "quarter of the CPUs, from 1 to 4");
ABSL_FLAG(uint32_t, session_busy_poll_us, 0,
          "Microseconds a session socket's thread that has just served something polls for more "
          "before it sleeps; at most 10000");
ABSL_FLAG(uint32_t, max_sessions, 1024, "Sessions open at once; one more is refused");
ABSL_FLAG(uint32_t, max_events, 2048,
          "Interprocess events the daemon may create (copies in flight, sessions' done events); "
          "keep it below the device's per-process limit");
ABSL_FLAG(uint32_t, session_done_events, 4,
          "Done events each session is given, for releases and commits on that many streams at "
          "once");
ABSL_FLAG(tierd::ByteSize, max_unread_answer_bytes, tierd::ByteSize{0},
          "Answers queued for clients that do not read them, summed over every session; a session "
          "that would take the sum past it is cut (0: MemAvailable/16, at least 64MiB and at most "
          "1GiB)");
ABSL_FLAG(tierd::ByteSize, session_max_staging_bytes, tierd::ByteSize{0},
          "GPU staging bytes one session may hold leased, reserved or pinned (0: the whole pool)");
ABSL_FLAG(std::string, spill_dir, "",
          "Where stored objects spill when the host cache is full (default: <state-dir>/spill)");
ABSL_FLAG(int, pin_threads, 0,
          "Threads pinning the host cache after its first GiB; 0: half the CPUs, from 1 to 8");
ABSL_FLAG(std::string, host_cache_policy, "fifo", "Host cache eviction: fifo or lru");
ABSL_FLAG(
    bool, compress_weights, false,
    "Keep bf16/fp16 weights compressed (lossless) in the host cache once read, decoded on the "
    "GPU (docs/COMPRESSION.md); objects that would not gain stay raw");
ABSL_FLAG(int, compress_threads, 1, "Threads that compress weights in the host cache, 1 to 64");
ABSL_FLAG(bool, check_decodes_before_serving, true,
          "Answer a fetch of a compressed object once its decode on the GPU matched its checksums "
          "(true), or as soon as the decode is enqueued, as raw copies are (false: clients queue "
          "work ahead, but a decode that fails its check has already been leased)");
ABSL_FLAG(bool, copy_while_reading, false,
          "Copy an object read from a local file to the GPU segment by segment as it lands "
          "(served only once all of it is checked), rather than once it is read; experimental: "
          "slower so far (docs/BENCHMARKS.md)");
ABSL_FLAG(uint32_t, decode_scratch_mib, 1024,
          "Device memory (MiB) each copy stream decodes compressed objects through: how far its "
          "copies may run ahead of its decodes; 56 to 16384");
ABSL_FLAG(std::string, reader_threads, "auto",
          "Disk reader threads, one io_uring ring each: a number, or auto (sized to the storage "
          "under --model-roots, else --state-dir, and to the cores; logged)");
ABSL_FLAG(int, reader_queue_depth, 16, "Disk reads in flight per reader thread");
ABSL_FLAG(tierd::ByteSize, reader_chunk_bytes, tierd::ByteSize{4ull << 20},
          "Size of each disk read (a multiple of 4KiB)");
ABSL_FLAG(std::string, io_engine, "auto", "auto (io_uring, else pread), io_uring or pread");
ABSL_FLAG(bool, direct_io, true, "Read model files with O_DIRECT where the filesystem allows");
ABSL_FLAG(int, v, 0, "Verbosity of debug logging (0 = off)");
ABSL_FLAG(int, shutdown_grace_ms, 5000, "How long in-flight calls may finish after SIGTERM");
ABSL_FLAG(std::string, socket_group, "",
          "Group to give the sockets (mode 0660), e.g. tierd; empty: the daemon's own group");
ABSL_FLAG(std::string, client_groups, "",
          "Client groups with GPU staging slabs and stored objects of their own, as "
          "NAME:UNIXGROUP:GPU_POOL_BYTES[,...]; each serves sessions on X.NAME.session.sock beside "
          "--socket, owned by UNIXGROUP (mode 0660)");
ABSL_FLAG(std::string, model_roots, "",
          "Comma-separated directories models may be registered from (symlinks resolved); empty: "
          "any directory");
ABSL_FLAG(std::string, s3_endpoint, "",
          "S3 endpoint models may be registered from as s3://BUCKET/PREFIX/ (e.g. "
          "https://s3.us-east-1.amazonaws.com, http://127.0.0.1:7480); empty: none");
ABSL_FLAG(std::string, s3_region, "",
          "Region requests are signed for; empty: AWS_REGION, AWS_DEFAULT_REGION or the profile's "
          "region, else us-east-1");
ABSL_FLAG(std::string, s3_addressing, "path",
          "path (ENDPOINT/BUCKET/KEY) or virtual (BUCKET.ENDPOINT/KEY)");
ABSL_FLAG(std::string, s3_credentials_file, "",
          "A credentials file (the AWS shared format) readable by tierd's user only; empty: the "
          "environment, then ~/.aws/credentials and ~/.aws/config");
ABSL_FLAG(std::string, s3_profile, "", "The credentials profile; empty: AWS_PROFILE, else default");
ABSL_FLAG(std::string, s3_ca_file, "",
          "PEM certificates an https:// --s3-endpoint is verified against (a private CA); empty: "
          "the system's CA store");
ABSL_FLAG(int, remote_streams, 16, "Ranged GETs from the S3 endpoint in flight at once");
ABSL_FLAG(uint32_t, remote_part_mib, 8, "The most one ranged GET asks for, in MiB");
ABSL_FLAG(int, remote_host_streams, 128,
          "Ranged GETs in flight at once across this node's daemons (those whose --socket is in "
          "the same directory, which holds the lock file tierd-remote-streams.lock); 0: no bound "
          "but each daemon's --remote-streams");
ABSL_FLAG(std::string, remote_cache_dir, "",
          "A directory on local disk that keeps remote models' bytes, in chunks checked against "
          "their ETag and checksum before use, so that a restarted daemon or another daemon of "
          "the node sharing it does not fetch them again; owned by tierd's user, mode 0700; "
          "empty: no cache");
ABSL_FLAG(tierd::ByteSize, remote_cache_bytes, tierd::ByteSize{0},
          "The most --remote-cache-dir may hold (least recently used chunks are removed past "
          "it); 0: 80% of the space its file system has free at start");
ABSL_FLAG(int, s3_stall_timeout_ms, 20000,
          "A request to the S3 endpoint that moves under 1 KiB/s for this long is retried");
ABSL_FLAG(int, s3_attempts, 6,
          "Attempts of an S3 request without progress before it fails UNAVAILABLE (retries back "
          "off exponentially, with jitter)");
ABSL_FLAG(uint32_t, max_tensors_per_model, tierd::kDefaultMaxTensorsPerModel,
          "Tensors one registered model may have; a model with more is refused");
ABSL_FLAG(
    std::string, peers, "",
    "Comma-separated --socket paths of the daemons of this node's other GPUs; a stored object "
    "not found here is fetched from the first that has it (this daemon's own socket may be "
    "listed: it is skipped)");
ABSL_FLAG(std::string, peer_copy, "auto",
          "How objects are copied from --peers: auto (GPU to GPU where this GPU can read the "
          "peer's memory, through pinned host memory otherwise), direct, or host");
ABSL_FLAG(tierd::ByteSize, peer_host_buffer_bytes, tierd::ByteSize{256ull << 20},
          "Pinned host memory objects are copied through for peers that cannot read this GPU's "
          "memory (allocated on first use); an object larger cannot go that way");
ABSL_FLAG(bool, node_host_tier, true,
          "With --peers: the node's daemons share one host tier. Each model object is read from "
          "disk and kept in pinned memory by one home daemon only; the others copy it to their "
          "GPU from the home's host arena, which is then POSIX shared memory (/dev/shm must hold "
          "--host-cache-bytes)");
ABSL_FLAG(int, node_home_timeout_ms, 30000,
          "How long an object's home daemon may answer nothing while a fetch waits for its lease "
          "before the object is read here (a home busy reading answers other requests meanwhile)");
ABSL_FLAG(std::optional<int>, metrics_port, std::nullopt,
          "Serve Prometheus metrics over HTTP on this port at /metrics; 0 or not given: no "
          "metrics endpoint");
ABSL_FLAG(std::string, metrics_address, "",
          "Address the metrics endpoint listens on, with --metrics-port; empty: 127.0.0.1 "
          "(loopback); 0.0.0.0 for all");
ABSL_FLAG(std::string, config, "",
          "File of further flags, one `key = value` per line (key: a flag without its dashes); "
          "flags on the command line win");

namespace {

constexpr int kExitBadUsage = 2;
// After SIGTERM the daemon exits within --shutdown-grace-ms plus this, whatever its teardown waits
// on (such as a device that never completes a dead client's work).
constexpr absl::Duration kTeardownBound = absl::Seconds(10);

// Pings the systemd watchdog at half its interval, from the health monitor's rounds.
std::function<void()> WatchdogHeartbeat(const tierd::SystemdNotifier& systemd) {
  if (!systemd.watchdog_interval().has_value()) return nullptr;
  const absl::Duration every = *systemd.watchdog_interval() / 2;
  auto last = std::make_shared<absl::Time>(absl::InfinitePast());
  return [&systemd, every, last] {
    const absl::Time now = absl::Now();
    if (now - *last < every) return;
    *last = now;
    if (absl::Status sent = systemd.Notify("WATCHDOG=1"); !sent.ok()) {
      TIERD_LOG_FIRST_N(WARNING, 1) << "cannot ping the systemd watchdog: " << sent;
    }
  };
}

void NotifySystemd(const tierd::SystemdNotifier& systemd, const std::string& state) {
  if (absl::Status sent = systemd.Notify(state); !sent.ok()) {
    TIERD_LOG(WARNING) << "cannot notify systemd: " << sent;
  }
}

// A flag's word that is none of its values: INVALID_ARGUMENT, as a value ValidateOptions refuses.
absl::Status BadWord(absl::string_view flag, absl::string_view values, absl::string_view word) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " must be ", values, ", not '", word, "'"));
}

// The daemon's options as the flags (and --config's file) give them. Parsing only: a word that is
// none of a flag's values, a list that does not parse. Values are checked by ValidateOptions.
absl::StatusOr<tierd::DaemonOptions> OptionsFromFlags() {
  tierd::DaemonOptions options;
  ASSIGN_OR_RETURN(options.device, tierd::ParseDeviceSpec(absl::GetFlag(FLAGS_device)));
  options.socket_path = absl::GetFlag(FLAGS_socket);
  options.session_socket_path = absl::GetFlag(FLAGS_session_socket);
  if (options.session_socket_path == "default") {
    options.session_socket_path = tierd::SessionSocketPathFor(options.socket_path);
  }
  options.state_dir = absl::GetFlag(FLAGS_state_dir);

  // The tiers.
  options.host_cache_bytes = absl::GetFlag(FLAGS_host_cache_bytes).bytes;
  options.pin_threads = absl::GetFlag(FLAGS_pin_threads);
  options.gpu_pool_bytes = absl::GetFlag(FLAGS_gpu_pool_bytes).bytes;
  options.gpu_slab_bytes = absl::GetFlag(FLAGS_gpu_slab_bytes).bytes;
  if (const std::string retain = absl::GetFlag(FLAGS_retain_bytes); retain != "half") {
    absl::StatusOr<uint64_t> bytes = tierd::ParseByteSize(retain);
    if (!bytes.ok()) return BadWord("retain-bytes", "half or a size such as 8GiB", retain);
    options.retain_bytes = *bytes;
  }
  options.spill_dir = absl::GetFlag(FLAGS_spill_dir);
  const std::string policy = absl::GetFlag(FLAGS_host_cache_policy);
  const std::optional<tierd::EvictionPolicy> eviction = tierd::ParseEvictionPolicy(policy);
  if (!eviction) return BadWord("host-cache-policy", "fifo or lru", policy);
  options.host_cache_policy = *eviction;
  options.compress_weights = absl::GetFlag(FLAGS_compress_weights);
  options.compress_threads = absl::GetFlag(FLAGS_compress_threads);
  options.check_decodes_before_serving = absl::GetFlag(FLAGS_check_decodes_before_serving);
  options.copy_while_reading = absl::GetFlag(FLAGS_copy_while_reading);
  options.decode_scratch_bytes = uint64_t{absl::GetFlag(FLAGS_decode_scratch_mib)} << 20;
  options.max_tensors_per_model = absl::GetFlag(FLAGS_max_tensors_per_model);

  // The disk reader.
  const std::string reader_threads = absl::GetFlag(FLAGS_reader_threads);
  if (reader_threads == "auto") {
    options.reader.threads = 0;  // Daemon::Create sizes it
  } else if (!absl::SimpleAtoi(reader_threads, &options.reader.threads) ||
             options.reader.threads < 1) {
    return BadWord("reader-threads", "auto or a number from 1", reader_threads);
  }
  options.reader.queue_depth = absl::GetFlag(FLAGS_reader_queue_depth);
  options.reader.chunk_bytes = absl::GetFlag(FLAGS_reader_chunk_bytes).bytes;
  options.reader.direct = absl::GetFlag(FLAGS_direct_io);
  const std::string io_engine = absl::GetFlag(FLAGS_io_engine);
  const std::optional<tierd::IoEngine> engine = tierd::ParseIoEngine(io_engine);
  if (!engine) return BadWord("io-engine", "auto, io_uring or pread", io_engine);
  options.reader.engine = *engine;

  // Sessions and clients.
  options.session_limits.max_leases = absl::GetFlag(FLAGS_session_max_leases);
  options.session_max_requests = absl::GetFlag(FLAGS_session_max_requests);
  options.session_threads = absl::GetFlag(FLAGS_session_threads);
  options.session_busy_poll = absl::Microseconds(absl::GetFlag(FLAGS_session_busy_poll_us));
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.max_events = absl::GetFlag(FLAGS_max_events);
  options.session_done_events = absl::GetFlag(FLAGS_session_done_events);
  options.max_unread_answer_bytes = absl::GetFlag(FLAGS_max_unread_answer_bytes).bytes;
  if (options.max_unread_answer_bytes == 0) {
    options.max_unread_answer_bytes = tierd::DefaultMaxUnreadAnswerBytes();
  }
  const uint64_t session_staging = absl::GetFlag(FLAGS_session_max_staging_bytes).bytes;
  options.session_limits.max_staging_bytes =
      session_staging == 0 ? options.gpu_pool_bytes : session_staging;
  options.socket_group = absl::GetFlag(FLAGS_socket_group);
  ASSIGN_OR_RETURN(options.client_groups,
                   tierd::ParseClientGroups(absl::GetFlag(FLAGS_client_groups)));
  options.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));

  // Where models come from.
  for (absl::string_view root :
       absl::StrSplit(absl::GetFlag(FLAGS_model_roots), ',', absl::SkipWhitespace())) {
    options.model_roots.emplace_back(absl::StripAsciiWhitespace(root));
  }
  tierd::RemoteOptions& remote = options.remote;
  remote.endpoint = absl::GetFlag(FLAGS_s3_endpoint);
  remote.region = absl::GetFlag(FLAGS_s3_region);
  const std::string addressing = absl::GetFlag(FLAGS_s3_addressing);
  if (addressing != "path" && addressing != "virtual") {
    return BadWord("s3-addressing", "path or virtual", addressing);
  }
  remote.path_style = addressing == "path";
  remote.credentials_file = absl::GetFlag(FLAGS_s3_credentials_file);
  remote.profile = absl::GetFlag(FLAGS_s3_profile);
  remote.ca_file = absl::GetFlag(FLAGS_s3_ca_file);
  remote.streams = absl::GetFlag(FLAGS_remote_streams);
  remote.part_bytes = uint64_t{absl::GetFlag(FLAGS_remote_part_mib)} << 20;
  remote.host_streams = absl::GetFlag(FLAGS_remote_host_streams);
  remote.cache_dir = absl::GetFlag(FLAGS_remote_cache_dir);
  remote.cache_bytes = absl::GetFlag(FLAGS_remote_cache_bytes).bytes;
  remote.stall_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_s3_stall_timeout_ms));
  remote.attempts = absl::GetFlag(FLAGS_s3_attempts);

  // The node's other daemons.
  for (absl::string_view peer :
       absl::StrSplit(absl::GetFlag(FLAGS_peers), ',', absl::SkipWhitespace())) {
    options.peer_sockets.emplace_back(absl::StripAsciiWhitespace(peer));
  }
  absl::StatusOr<tierd::PeerCopyPath> peer_copy =
      tierd::ParsePeerCopyPath(absl::GetFlag(FLAGS_peer_copy));
  if (!peer_copy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--peer-copy: ", peer_copy.status().message()));
  }
  options.peer_copy = *peer_copy;
  options.peer_host_buffer_bytes = absl::GetFlag(FLAGS_peer_host_buffer_bytes).bytes;
  options.node_host_tier = absl::GetFlag(FLAGS_node_host_tier);
  options.node_home_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_node_home_timeout_ms));

  // Metrics. --metrics-port=0 turns them off, and the address with them (a config file's, given to
  // every GPU's daemon, while the port comes per GPU); DaemonOptions' port 0 is "any port". An
  // address with no port at all is refused by ValidateOptions.
  const std::optional<int> metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port != 0) {
    options.metrics_port = metrics_port;
    options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  }
  return options;
}

int Run() {
  tierd::SetLogVerbosity(absl::GetFlag(FLAGS_v));
  // Abseil tracks lock order for deadlock detection in builds without NDEBUG, Debian's among
  // them: every lock of every mutex then updates one graph under one process-wide lock, which
  // serialized the sessions' threads under load (docs/BENCHMARKS.md, "Many clients"). The tests
  // keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  static const tierd::SystemdNotifier systemd = tierd::SystemdNotifier::FromEnvironment();
  absl::StatusOr<tierd::DaemonOptions> parsed = OptionsFromFlags();
  if (parsed.ok()) {
    if (absl::Status valid = tierd::ValidateOptions(*parsed); !valid.ok()) parsed = valid;
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "tierd: %s\n", std::string(parsed.status().message()).c_str());
    return kExitBadUsage;
  }
  tierd::DaemonOptions& options = *parsed;
  options.heartbeat = WatchdogHeartbeat(systemd);
  if (systemd.watchdog_interval().has_value()) {
    // Rounds often enough that a ping at half the interval is never late by much.
    options.health_check_period =
        std::min(options.health_check_period, *systemd.watchdog_interval() / 4);
  }

  // Signals are taken synchronously by this thread; every thread created after this inherits the
  // mask, so none of them is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::unique_ptr<tierd::Daemon>> daemon = tierd::Daemon::Create(options);
  if (!daemon.ok()) {
    TIERD_LOG(ERROR) << "cannot start: " << daemon.status();
    NotifySystemd(systemd, absl::StrCat("STATUS=cannot start: ", daemon.status().message()));
    return daemon.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadUsage : 1;
  }
  NotifySystemd(systemd, absl::StrCat("READY=1\nSTATUS=serving on ", options.socket_path));
  int received = 0;
  sigwait(&signals, &received);
  const absl::Duration grace = options.shutdown_grace;
  TIERD_LOG(INFO) << "received " << (received == SIGTERM ? "SIGTERM" : "SIGINT")
                  << ", shutting down (in-flight work has " << absl::FormatDuration(grace) << ")";
  NotifySystemd(systemd, "STOPPING=1\nSTATUS=shutting down");
  // The bound: a teardown that waits longer is cut short. The process's exit frees what the device
  // holds, and nothing durable is left half-written (the catalog is written before registration
  // answers; spilled objects are not kept across restarts).
  std::thread([bound = grace + kTeardownBound] {
    absl::SleepFor(bound);
    TIERD_LOG(WARNING) << "shutdown took longer than " << absl::FormatDuration(bound)
                       << " (the device is still finishing work); exiting without waiting";
    std::_Exit(0);
  }).detach();
  (*daemon)->Shutdown(grace);
  daemon->reset();
  TIERD_LOG(INFO) << "stopped";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tierd [--config=FILE] --device=auto|host|cuda:N --socket=PATH --state-dir=DIR "
      "--host-cache-bytes=N --gpu-pool-bytes=N\n"
      "Flags may be spelled with dashes or underscores (--state-dir or --state_dir), and given "
      "in --config's file as `state-dir = DIR`.");
  // The file's flags first, so those on the command line, parsed next, win.
  if (std::optional<std::string> config = tierd::FindFlagOnCommandLine(argc, argv, "config");
      config.has_value() && !config->empty()) {
    if (absl::Status applied = tierd::ApplyConfigFile(*config, __FILE__, "config"); !applied.ok()) {
      std::fprintf(stderr, "tierd: %s\n", std::string(applied.message()).c_str());
      return kExitBadUsage;
    }
  }
  absl::StatusOr<std::vector<std::string>> positional =
      tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
  if (!positional.ok()) {
    std::fprintf(stderr, "tierd: %s\n", std::string(positional.status().message()).c_str());
    return kExitBadUsage;
  }
  if (positional->size() > 1) {
    std::fprintf(stderr, "tierd: unexpected argument '%s'\n", (*positional)[1].c_str());
    return kExitBadUsage;
  }
  return Run();
}
