// What a Daemon is built from. Filled by tierd's main() from flags.
#ifndef TIERD_SERVER_DAEMON_OPTIONS_H_
#define TIERD_SERVER_DAEMON_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "device/device_factory.h"
#include "gpu/gpu_tier.h"
#include "server/client_groups.h"
#include "server/node/peer_daemons.h"
#include "storage/file_system.h"
#include "storage/host/host_cache.h"
#include "storage/io/disk_reader.h"
#include "storage/model/catalog.h"

namespace tierd {

// The disk reader's defaults, its threads left to --reader-threads=auto.
inline DiskReaderOptions AutoSizedReader() {
  DiskReaderOptions reader;
  reader.threads = 0;
  return reader;
}

// Models in object storage (docs/REMOTE.md): the --s3-* and --remote-* flags.
struct RemoteOptions {
  // --s3-endpoint: the endpoint's URL; empty: models cannot be registered from s3:// URLs.
  std::string endpoint;
  // --s3-region: empty: AWS_REGION, AWS_DEFAULT_REGION or the profile's, else us-east-1.
  std::string region;
  bool path_style = true;  // --s3-addressing=path (HOST/BUCKET); false: virtual (BUCKET.HOST)
  // --s3-credentials-file and --s3-profile: where the keys are (remote/s3_credentials.h).
  std::string credentials_file;
  std::string profile;
  // --s3-ca-file: the certificates an https:// endpoint is checked against; empty: the system's.
  std::string ca_file;
  // --s3-stall-timeout-ms: a request moving under 1 KiB/s this long is retried; --s3-attempts:
  // attempts without progress before a read fails UNAVAILABLE.
  absl::Duration stall_timeout = absl::Seconds(20);
  int attempts = 6;
  // --remote-streams: ranged GETs in flight at once; --remote-part-mib: the most one asks for.
  int streams = 16;
  uint64_t part_bytes = 8ull << 20;
  // --remote-host-streams: the most GETs in flight at once across the daemons of this user whose
  // sockets share a directory (a lock file there, tierd-remote-streams.lock); 0: no such bound.
  int host_streams = 128;
  // --remote-cache-dir: a cache of remote models' bytes on local disk, which the node's daemons
  // may share (storage/io/remote_cache.h); empty: none. --remote-cache-bytes: its budget; 0: 80% of
  // the space its file system has free when the daemon starts (what it holds counted as free).
  std::string cache_dir;
  uint64_t cache_bytes = 0;
};

struct DaemonOptions {
  DeviceSpec device;        // --device
  std::string socket_path;  // --socket: unix socket the gRPC server listens on
  // --session-socket: where sessions are served without gRPC (wire/session_socket.h); empty:
  // none.
  std::string session_socket_path;
  std::string state_dir;          // --state-dir: persistent state; one daemon per directory
  uint64_t host_cache_bytes = 0;  // --host-cache-bytes: budget of the pinned host tier
  uint64_t gpu_pool_bytes = 0;    // --gpu-pool-bytes: budget of the GPU staging tier
  uint64_t gpu_slab_bytes =
      2ull << 30;               // --gpu-slab-bytes: the pool is allocated in slabs this big
  // --retain-bytes: what the default group's retained sets may hold of its pool; nullopt: half.
  std::optional<uint64_t> retain_bytes;
  ClientLimits session_limits;  // --session-max-leases, --session-max-staging-bytes
  uint32_t session_max_requests = 1024;  // --session-max-requests: unanswered, per session
  // --session-threads: threads serving the session socket's connections (each socket's: a client
  // group's has as many); 0: DefaultSessionThreads() (server/session_socket_server.h).
  int session_threads = 0;
  // --session-busy-poll-us: how long a session socket's thread that has just served something
  // polls for more before it sleeps.
  absl::Duration session_busy_poll = absl::ZeroDuration();
  uint32_t max_sessions = 1024;  // --max-sessions: open at once
  // --max-events: interprocess events the daemon may create, below the device's per-process limit
  // (docs/DESIGN.md, "Interprocess events").
  uint32_t max_events = 2048;
  uint32_t session_done_events = 4;  // --session-done-events: each session's done events
  // --max-unread-answer-bytes: answers queued for clients that do not read them, summed over every
  // session (server/unread_answer_budget.h); main() defaults it to DefaultMaxUnreadAnswerBytes().
  uint64_t max_unread_answer_bytes = 1ull << 30;
  std::string spill_dir;  // --spill-dir: where stored objects spill; empty: <state-dir>/spill
  EvictionPolicy host_cache_policy = EvictionPolicy::kFifo;  // --host-cache-policy
  bool compress_weights = false;                             // --compress-weights
  int compress_threads = 1;                                  // --compress-threads
  uint64_t decode_scratch_bytes = 1ull << 30;                // --decode-scratch-mib
  bool check_decodes_before_serving = true;                  // --check-decodes-before-serving
  bool copy_while_reading = false;                           // --copy-while-reading
  uint64_t pin_piece_bytes = 1ull << 30;  // the host arena is pinned this much at a time
  // --pin-threads: threads pinning the host arena after its first piece; 0: DefaultPinThreads()
  // (storage/host/host_arena.h), half the CPUs from 1 to 8.
  int pin_threads = 0;
  // --reader-threads (threads 0: auto, storage/io/reader_sizing.h, the default here as for the
  // flag), --reader-queue-depth, --reader-chunk-bytes, --io-engine, --direct-io
  DiskReaderOptions reader = AutoSizedReader();
  std::string socket_group;  // --socket-group: the sockets' group; empty: the daemon's own
  // --client-groups: groups with GPU staging and stored objects of their own, each serving
  // sessions on ClientGroupSocketPathFor(socket_path, name). Needs the session socket.
  std::vector<ClientGroupOptions> client_groups;
  // --peers: the gRPC sockets of the node's other daemons, asked for stored objects not found here
  // (server/node/peer_daemons.h); this daemon's own socket_path among them is skipped.
  std::vector<std::string> peer_sockets;
  PeerCopyPath peer_copy = PeerCopyPath::kAuto;  // --peer-copy
  // --peer-host-buffer-bytes: pinned host memory for peers that copy through the host.
  uint64_t peer_host_buffer_bytes = 256ull << 20;
  // --node-host-tier: with peers, the daemons share one host tier (server/node/node_host_tier.h):
  // each model object is read and pinned by its home daemon only, and the host arena is shared
  // memory the peers map.
  bool node_host_tier = true;
  // --node-home-timeout-ms: how long a home may answer nothing before a fetch waiting for its
  // lease reads the object here.
  absl::Duration node_home_timeout = absl::Seconds(30);
  // --model-roots: directories (and s3:// buckets or prefixes) models may be registered from;
  // empty: anywhere.
  std::vector<std::string> model_roots;
  RemoteOptions remote;  // --s3-* and --remote-*
  // Tensors one registered model may have (--max-tensors-per-model).
  size_t max_tensors_per_model = kDefaultMaxTensorsPerModel;
  // --metrics-port, --metrics-address: where Prometheus text is served; no port: nowhere; 0: a
  // port the kernel picks (Daemon::metrics_port() says which). An empty address: loopback
  // (kDefaultMetricsAddress); an address without a port is refused.
  std::optional<int> metrics_port;
  std::string metrics_address;
  // --shutdown-grace-ms: how long in-flight calls may finish after SIGTERM (tierd's main waits
  // this long in Daemon::Shutdown).
  absl::Duration shutdown_grace = absl::Seconds(5);

  // How often the health monitor checks the device and the tiers.
  absl::Duration health_check_period = absl::Seconds(1);
  // Called after every health round (tierd's main pings the systemd watchdog); may be empty.
  std::function<void()> heartbeat;
  // Every file the storage tiers open, write, sync or remove goes through it; tests wrap the real
  // one to fail or slow chosen files. Null: the POSIX file system.
  std::shared_ptr<FileSystem> file_system;
  // Makes the device instead of CreateDevice(device): tests wrap one to slow or fail it.
  std::function<absl::StatusOr<std::unique_ptr<Device>>()> create_device;
};

inline constexpr char kDefaultMetricsAddress[] = "127.0.0.1";

// Every check of the values a daemon is given, whoever built the options (tierd's flags, a
// config file, a test): INVALID_ARGUMENT naming the flag and what it must be. Checks against
// the machine (memory, cores, /dev/shm) come later, in CheckDaemonLimits
// (server/resource_limits.h), once --reader-threads=auto is sized. Daemon::Create calls it;
// tierd's main calls it first, to exit with status 2 before anything starts.
absl::Status ValidateOptions(const DaemonOptions& options);

// Each GPU tier's share of --max-events: the default group's tier and each client group's.
uint32_t EventShare(const DaemonOptions& options);

// Whether the daemon takes part in a node host tier: --node-host-tier, and --peers names a daemon
// other than this one. Its host arena is then POSIX shared memory (/dev/shm).
inline bool SharesHostTier(const DaemonOptions& options) {
  if (!options.node_host_tier) return false;
  for (const std::string& peer : options.peer_sockets) {
    if (peer != options.socket_path) return true;
  }
  return false;
}

}  // namespace tierd

#endif  // TIERD_SERVER_DAEMON_OPTIONS_H_
