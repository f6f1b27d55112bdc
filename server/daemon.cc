#include "server/daemon.h"

#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "grpc/health/v1/health.pb.h"
#include "server/unix_socket.h"

namespace tierd {
namespace {

absl::Status ValidateOptions(const DaemonOptions& options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("--state-dir is empty");
  if (options.host_cache_bytes == 0) {
    return absl::InvalidArgumentError("--host-cache-bytes must be greater than 0");
  }
  if (options.gpu_pool_bytes == 0) {
    return absl::InvalidArgumentError("--gpu-pool-bytes must be greater than 0");
  }
  if (options.gpu_slab_bytes == 0) {
    return absl::InvalidArgumentError("--gpu-slab-bytes must be greater than 0");
  }
  if (options.session_limits.max_leases == 0) {
    return absl::InvalidArgumentError("--session-max-leases must be greater than 0");
  }
  if (options.session_limits.max_staging_bytes == 0) {
    return absl::InvalidArgumentError("--session-max-staging-bytes must be greater than 0");
  }
  return absl::OkStatus();
}

// Creates the state directory and holds an exclusive lock on it for the daemon's life, so two
// daemons never share one. Returns the lock's file descriptor.
absl::StatusOr<int> LockStateDir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return PosixError(absl::StrCat("creating --state-dir ", dir), error.value());
  const std::string lock_path = absl::StrCat(dir, "/lock");
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return PosixError(absl::StrCat("opening ", lock_path), errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    ::close(fd);
    if (saved == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("--state-dir ", dir, " is in use by another tierd"));
    }
    return PosixError(absl::StrCat("locking ", lock_path), saved);
  }
  return fd;
}

SessionOptions SessionOptionsFor(const Device& device, const DaemonOptions& options) {
  SessionOptions session;
  session.limits = options.session_limits;
  session.device = device.Describe();
  session.backend = device.backend();
  session.device_ordinal = device.ordinal();
  return session;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const DaemonOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  RETURN_IF_ERROR(PrepareSocketPath(options.socket_path));
  ASSIGN_OR_RETURN(const int lock_fd, LockStateDir(options.state_dir));
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options.device);
  if (!device.ok()) {
    ::close(lock_fd);
    return device.status();
  }
  TIERD_LOG(INFO) << "device " << (*device)->Describe() << ", host cache budget "
                  << FormatByteSize(options.host_cache_bytes) << ", GPU pool budget "
                  << FormatByteSize(options.gpu_pool_bytes);
  std::unique_ptr<Daemon> daemon(new Daemon(options, *std::move(device), lock_fd));
  RETURN_IF_ERROR(daemon->StartStorage());

  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's built-in health service encodes its messages without protobuf descriptors, so
  // reflection could list it but not describe it, and grpcurl could not call it. Touching the
  // generated descriptor links it in and registers it with the pool reflection serves from.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", options.socket_path),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(daemon->service_.get());
  daemon->server_ = builder.BuildAndStart();
  if (daemon->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.socket_path));
  }
  // Whoever may use the GPU through this daemon is in the socket's group; nobody else.
  if (::chmod(options.socket_path.c_str(), 0660) != 0) {
    return PosixError(absl::StrCat("chmod ", options.socket_path), errno);
  }
  if (!options.session_socket_path.empty()) {
    ASSIGN_OR_RETURN(daemon->session_server_,
                     SessionSocketServer::Start(options.session_socket_path, *daemon->gpu_tier_,
                                                SessionOptionsFor(*daemon->device_, options)));
    TIERD_LOG(INFO) << "serving sessions on " << options.session_socket_path;
  }
  daemon->server_->GetHealthCheckService()->SetServingStatus(true);
  TIERD_LOG(INFO) << "serving on unix:" << options.socket_path;
  return daemon;
}

absl::Status Daemon::StartStorage() {
  ASSIGN_OR_RETURN(catalog_, Catalog::Open(options_.state_dir));
  TIERD_LOG(INFO) << "catalog: " << catalog_->ListModels().size() << " model(s) registered";
  ASSIGN_OR_RETURN(
      arena_, HostArena::Create(*device_, {options_.host_cache_bytes, options_.pin_piece_bytes}));
  TIERD_LOG(INFO) << "host arena: " << FormatByteSize(arena_->pinned_bytes()) << " of "
                  << FormatByteSize(arena_->capacity())
                  << " pinned; the rest pins in the background";
  ASSIGN_OR_RETURN(reader_, DiskReader::Create(options_.reader));
  const std::string spill_dir =
      options_.spill_dir.empty() ? absl::StrCat(options_.state_dir, "/spill") : options_.spill_dir;
  ASSIGN_OR_RETURN(spill_, SpillWriter::Create(spill_dir));
  host_cache_ = std::make_unique<HostCache>(*catalog_, *reader_, *arena_, spill_.get(),
                                            HostCacheOptions{options_.host_cache_policy});
  GpuTierOptions gpu;
  gpu.pool_bytes = options_.gpu_pool_bytes;
  gpu.slab_bytes = options_.gpu_slab_bytes;
  ASSIGN_OR_RETURN(gpu_tier_, GpuTier::Create(*device_, *catalog_, *arena_, *host_cache_, gpu));
  TIERD_LOG(INFO) << "GPU staging pool: " << FormatByteSize(gpu_tier_->pool().capacity())
                  << " in " << gpu_tier_->pool().slab_count() << " slab(s)";
  service_ = std::make_unique<TierdService>(*catalog_, *host_cache_, *gpu_tier_,
                                            SessionOptionsFor(*device_, options_));
  return absl::OkStatus();
}

Daemon::Daemon(DaemonOptions options, std::unique_ptr<Device> device, int state_lock_fd)
    : options_(std::move(options)), device_(std::move(device)), state_lock_fd_(state_lock_fd) {}

Daemon::~Daemon() {
  Shutdown(absl::ZeroDuration());
  session_server_.reset();
  server_.reset();
  service_.reset();
  gpu_tier_.reset();
  host_cache_.reset();
  spill_.reset();
  reader_.reset();
  arena_.reset();
  catalog_.reset();
  device_.reset();
  ::close(state_lock_fd_);
}

void Daemon::Shutdown(absl::Duration grace) {
  if (server_ == nullptr) return;  // storage failed to start: nothing serves
  const absl::Time deadline = absl::Now() + grace;
  service_->StartShutdown();
  if (session_server_ != nullptr) session_server_->StopAccepting();
  server_->GetHealthCheckService()->SetServingStatus(false);
  // grpc::Server::Shutdown is idempotent and thread-safe.
  server_->Shutdown(absl::ToChronoTime(deadline));
  // Sessions on the session socket get what is left of the grace.
  if (session_server_ != nullptr) session_server_->Shutdown(deadline);
  ::unlink(options_.socket_path.c_str());
}

}  // namespace tierd
