// The tierd daemon: owns the Device, the state directory, the storage tiers (catalog, pinned host
// arena, disk reader, spill writer, host cache), the GPU tier and the gRPC server on the Unix
// socket. Created by main() (or a test) from DaemonOptions; serves until Shutdown().
#ifndef TIERD_SERVER_DAEMON_H_
#define TIERD_SERVER_DAEMON_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "server/daemon_options.h"
#include "server/gpu_tier.h"
#include "server/session_socket_server.h"
#include "server/tierd_service.h"
#include "storage/catalog.h"
#include "storage/disk_reader.h"
#include "storage/host_arena.h"
#include "storage/host_cache.h"
#include "storage/spill_writer.h"

namespace grpc {
class Server;
}

namespace tierd {

class Daemon {
 public:
  // Validates `options`, takes the state directory's lock, creates the device, loads the catalog,
  // pins the first piece of the host arena (the rest pins in the background), allocates the GPU
  // staging pool, and starts serving tierd.v1.Tierd, the standard health service (SERVING) and
  // server reflection on the socket.
  // Errors: INVALID_ARGUMENT for bad options (naming the option); FAILED_PRECONDITION when the
  // socket or state directory is in use by another daemon; the device's errors.
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const DaemonOptions& options);
  // Shuts down if still serving.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Refuses new sessions and calls (UNAVAILABLE), gives in-flight calls and open sessions (on
  // either socket) up to `grace` to finish, then cancels the rest: their sessions end and release
  // what they hold.
  // Idempotent; thread-safe.
  void Shutdown(absl::Duration grace);

  Device& device() { return *device_; }
  Catalog& catalog() { return *catalog_; }
  HostCache& host_cache() { return *host_cache_; }

 private:
  Daemon(DaemonOptions options, std::unique_ptr<Device> device, int state_lock_fd);
  absl::Status StartStorage();

  const DaemonOptions options_;
  // Declared in dependency order: destroyed from the bottom up.
  std::unique_ptr<Device> device_;
  int state_lock_fd_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<DiskReader> reader_;
  std::unique_ptr<SpillWriter> spill_;
  std::unique_ptr<HostCache> host_cache_;
  std::unique_ptr<GpuTier> gpu_tier_;
  std::unique_ptr<TierdService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<SessionSocketServer> session_server_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_DAEMON_H_
