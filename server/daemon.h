// The tierd daemon: owns the Device, the state directory, the storage tiers (catalog, pinned host
// arena, disk reader, spill writer, host cache), the GPU tier, the gRPC server on the Unix socket
// and the session socket, the health monitor and the metrics endpoint. Created by main() (or a
// test) from DaemonOptions; serves until Shutdown().
#ifndef TIERD_SERVER_DAEMON_H_
#define TIERD_SERVER_DAEMON_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "gpu/gpu_tier.h"
#include "server/daemon_options.h"
#include "server/health_monitor.h"
#include "server/metrics_server.h"
#include "server/node/host_lender.h"
#include "server/node/node_host_tier.h"
#include "server/node/peer_daemons.h"
#include "server/pressure_reporter.h"
#include "server/response_counters.h"
#include "server/session_socket_server.h"
#include "server/stats.h"
#include "server/throughput_meter.h"
#include "server/tierd_service.h"
#include "server/unread_answer_budget.h"
#include "storage/storage_stack.h"

namespace grpc {
class Server;
}

namespace tierd {

class Daemon {
 public:
  // Validates `options`, takes the state directory's lock and starts serving on the socket at once:
  // the standard health service says NOT_SERVING and tierd.v1.Tierd answers UNAVAILABLE while the
  // daemon creates the device, loads the catalog, pins the first piece of the host arena (the rest
  // pins in the background) and allocates the GPU staging pool. Then it serves sessions (on the
  // session socket too), health turns SERVING, and the health monitor and the metrics endpoint
  // start. Returns once serving. The socket appears under its name only once health answers, with
  // its mode and group already set.
  // Errors: INVALID_ARGUMENT for bad options (naming the option); FAILED_PRECONDITION when the
  // socket or state directory is in use by another daemon; UNAVAILABLE when a socket or the metrics
  // port cannot be bound; the device's errors.
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const DaemonOptions& options);
  // Shuts down if still serving.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Health turns NOT_SERVING; new sessions and calls are refused (UNAVAILABLE); in-flight calls and
  // open sessions (on either socket) get up to `grace` to finish, then the rest are cancelled:
  // their sessions end and release what they hold. The sockets are removed. Idempotent;
  // thread-safe.
  void Shutdown(absl::Duration grace) ABSL_LOCKS_EXCLUDED(shutdown_mu_);

  Device& device() { return *device_; }
  Catalog& catalog() { return storage_->catalog(); }
  HostCache& host_cache() { return storage_->host_cache(); }
  // The metrics endpoint's port; 0 when it is off.
  int metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }
  // What the health service says now.
  bool serving() const { return serving_.load(); }

 private:
  Daemon(DaemonOptions options, int state_lock_fd, std::optional<gid_t> socket_group);
  // Starts the gRPC server, not serving yet, on a temporary name beside the socket path, then
  // gives it its final name.
  absl::Status StartGrpcServer();
  absl::Status StartStorage();
  // The default group's and every client group's GPU tier; adopts the durable objects.
  absl::Status StartGpuTiers(std::vector<DurableRecord> durable_objects);
  // The client groups' session sockets.
  // How each session socket is served: --session-threads and --session-busy-poll-us.
  SessionSocketOptions SessionSocketServing() const;
  absl::Status StartClientGroupSockets(SessionOptions session);
  std::vector<NamedGpuTier> ClientGroupTiers() const;
  absl::Status StartMetrics();
  // The device's health, as the monitor reports it, unless shutting down.
  void ReportDeviceHealth(bool healthy) ABSL_LOCKS_EXCLUDED(health_mu_);
  // Samples the counters for the throughput meter and the pressure log; every health round, on
  // the monitor's thread.
  void SampleCounters();
  std::string RenderMetrics();

  const DaemonOptions options_;
  const std::optional<gid_t> socket_group_;
  ResponseCounters counters_;
  UnreadAnswerBudget unread_answers_;  // shared by every session's transport
  ThroughputMeter throughput_{absl::Seconds(10)};
  PressureReporter pressure_{absl::Seconds(30)};  // only the health monitor's rounds touch it
  std::atomic<bool> serving_{false};
  absl::Mutex health_mu_;
  bool shutting_down_ ABSL_GUARDED_BY(health_mu_) = false;
  absl::Mutex shutdown_mu_ ABSL_ACQUIRED_BEFORE(health_mu_);
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  // Declared in dependency order: destroyed from the bottom up.
  std::unique_ptr<Device> device_;
  int state_lock_fd_;
  std::unique_ptr<StorageStack> storage_;
  // The node's host tier (SharesHostTier; null without): lends objects homed here to the peers,
  // and borrows the others from their homes.
  std::unique_ptr<HostLender> host_lender_;
  std::unique_ptr<PeerDaemons> peers_;  // --peers; null without
  std::unique_ptr<LocalHostSource> local_host_;
  std::unique_ptr<NodeHostTier> node_host_tier_;
  std::unique_ptr<GpuTier> gpu_tier_;
  // --client-groups, in the order given.
  struct ClientGroup {
    ClientGroupOptions options;
    gid_t gid = 0;
    std::unique_ptr<GpuTier> tier;
    std::unique_ptr<SessionSocketServer> sessions;
  };
  std::vector<ClientGroup> client_groups_;
  std::unique_ptr<TierdService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<SessionSocketServer> session_server_;
  std::unique_ptr<HealthMonitor> monitor_;
  std::unique_ptr<MetricsServer> metrics_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_DAEMON_H_
