#include "server/daemon.h"

#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/leak_on_purpose.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "device/shared_memory.h"
#include "gpu/staging_pool.h"
#include "grpc/health/v1/health.pb.h"
#include "remote/s3_credentials.h"
#include "remote/s3_location.h"
#include "server/metrics_text.h"
#include "server/resource_limits.h"
#include "server/stats.h"
#include "server/unix_socket.h"
#include "storage/io/reader_sizing.h"
#include "storage/model_location.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

// The S3 client's options for --s3-endpoint, its region and credentials resolved (and logged
// without secrets); nullopt without an endpoint. Errors: the credentials' (NOT_FOUND,
// PERMISSION_DENIED for a credentials file others may read, ...), INVALID_ARGUMENT for an
// endpoint that is not a URL.
absl::StatusOr<std::optional<S3ClientOptions>> RemoteSourceOptions(const DaemonOptions& options) {
  if (options.remote.endpoint.empty()) return std::optional<S3ClientOptions>();
  S3CredentialOptions where;
  where.credentials_file = options.remote.credentials_file;
  where.profile = options.remote.profile;
  // Found again after a refusal (a rotated file), from the environment as it was at start.
  where.getenv = SnapshotS3Environment();
  S3ClientOptions client;
  client.endpoint.url = options.remote.endpoint;
  client.endpoint.path_style = options.remote.path_style;
  client.endpoint.region = !options.remote.region.empty()
                               ? options.remote.region
                               : ResolveS3Region(where).value_or("us-east-1");
  absl::StatusOr<std::string> url = S3EndpointUrl(client.endpoint);
  if (!url.ok())
    return absl::InvalidArgumentError(absl::StrCat("--s3-endpoint: ", url.status().message()));
  absl::StatusOr<S3Credentials> credentials = ResolveS3Credentials(where);
  if (!credentials.ok()) {
    return absl::Status(credentials.status().code(),
                        absl::StrCat("--s3-endpoint ", *url, ": ", credentials.status().message()));
  }
  client.credentials = *std::move(credentials);
  client.refresh_credentials = [where] { return ResolveS3Credentials(where); };
  // The secrets are in this process's memory from here on: out of its environment (children,
  // /proc/PID/environ), and no core file or same-user debugger may read them.
  ForgetS3SecretsInEnvironment();
  if (::prctl(PR_SET_DUMPABLE, 0) != 0) {
    TIERD_LOG(WARNING) << PosixError("making the process non-dumpable", errno);
  }
  if (absl::StartsWith(*url, "http://")) {
    TIERD_LOG(WARNING) << "--s3-endpoint " << *url
                       << " is plain HTTP: requests are signed (the secret itself is not sent), "
                          "but the session token, the keys' id and every model byte cross the "
                          "network unencrypted; use https:// beyond a trusted host";
  }
  client.stall_timeout = options.remote.stall_timeout;
  client.max_attempts = options.remote.attempts;
  client.ca_file = options.remote.ca_file;
  TIERD_LOG(INFO) << "remote models from " << *url << " (region " << client.endpoint.region << ", "
                  << (client.endpoint.path_style ? "path" : "virtual-hosted")
                  << "-style, credentials " << client.credentials.Describe()
                  << (client.ca_file.empty() ? "" : absl::StrCat(", CAs of ", client.ca_file))
                  << ", " << options.remote.streams << " streams)";
  return std::optional<S3ClientOptions>(std::move(client));
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

// Where a group's retained sets are recorded, to come back after a restart.
std::string RetainedStateFile(const std::string& state_dir, const std::string& group) {
  return absl::StrCat(state_dir, "/retained-", group, ".sets");
}

SessionOptions SessionOptionsFor(const Device& device, const DaemonOptions& options) {
  SessionOptions session;
  session.limits = options.session_limits;
  session.max_requests_in_flight = options.session_max_requests;
  session.device = device.Describe();
  session.backend = device.backend();
  session.device_ordinal = device.ordinal();
  return session;
}

// Where the gRPC server listens until it is ready to answer health checks: clients looking for the
// socket find nothing rather than a server that answers before its health service says how it is.
std::string StartingSocketPath(const std::string& path) { return path + ".starting"; }

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const DaemonOptions& requested) {
  RETURN_IF_ERROR(ValidateOptions(requested));
  // A daemon that crashed (this one before its restart, most likely) left its shared memory in
  // /dev/shm: gone before /dev/shm's free space is measured, or a restart would find too little.
  if (int removed = RemoveStaleSharedMemory(); removed > 0) {
    TIERD_LOG(INFO) << "removed " << removed
                    << " shared memory object(s) left by tierd processes that no longer run";
  }
  ASSIGN_OR_RETURN(const MachineResources machine, ReadMachineResources());
  DaemonOptions options = requested;
  if (options.reader.threads == 0) {
    // --reader-threads=auto: sized to the storage the models are confined to, else to the state
    // directory's (the best guess at where this node keeps its files).
    std::vector<std::string> local_roots;
    for (const std::string& root : options.model_roots) {
      absl::StatusOr<ModelLocation> location = ParseModelLocation(root);
      if (location.ok() && !location->in_object_store()) local_roots.push_back(root);
    }
    const ReaderSizing sizing =
        SizeReaders(local_roots.empty() ? std::vector<std::string>{options.state_dir} : local_roots,
                    machine.cpu_cores);
    options.reader.threads = sizing.threads;
    TIERD_LOG(INFO) << "disk reader threads (auto): " << sizing.why;
  }
  // Before anything is created: a budget the machine cannot hold is refused, not tried.
  RETURN_IF_ERROR(CheckDaemonLimits(options, machine));
  std::optional<gid_t> group;
  if (!options.socket_group.empty()) {
    ASSIGN_OR_RETURN(group, LookupSocketGroup(options.socket_group));
    RETURN_IF_ERROR(CheckMayGiveGroup(*group, options.socket_group, "--socket-group"));
  }
  std::vector<gid_t> client_group_ids;
  for (const ClientGroupOptions& client_group : options.client_groups) {
    absl::StatusOr<gid_t> gid = LookupSocketGroup(client_group.unix_group);
    if (!gid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--client-groups: ", client_group.name,
                                                     ": no Unix group '", client_group.unix_group,
                                                     "'"));
    }
    RETURN_IF_ERROR(CheckMayGiveGroup(*gid, client_group.unix_group,
                                      absl::StrCat("--client-groups: ", client_group.name)));
    client_group_ids.push_back(*gid);
    RETURN_IF_ERROR(
        PrepareSocketPath(ClientGroupSocketPathFor(options.socket_path, client_group.name)));
  }
  RETURN_IF_ERROR(PrepareSocketPath(options.socket_path));
  RETURN_IF_ERROR(PrepareSocketPath(StartingSocketPath(options.socket_path)));
  ASSIGN_OR_RETURN(const int lock_fd, LockStateDir(options.state_dir));
  std::unique_ptr<Daemon> daemon(new Daemon(options, lock_fd, group));
  for (size_t i = 0; i < options.client_groups.size(); ++i) {
    ClientGroup& client_group = daemon->client_groups_.emplace_back();
    client_group.options = options.client_groups[i];
    client_group.gid = client_group_ids[i];
  }
  RETURN_IF_ERROR(daemon->StartGrpcServer());
  TIERD_LOG(INFO) << "listening on unix:" << options.socket_path
                  << " (NOT_SERVING until the device and the host cache are ready)";

  absl::StatusOr<std::unique_ptr<Device>> device =
      options.create_device ? options.create_device() : CreateDevice(options.device);
  if (!device.ok()) return device.status();
  daemon->device_ = *std::move(device);
  // The staging pools against what the device has, before the host cache and the pools are
  // allocated.
  ASSIGN_OR_RETURN(const uint64_t device_free_bytes, daemon->device_->FreeMemoryBytes());
  RETURN_IF_ERROR(
      CheckStagingMemory(options, machine, daemon->device_->backend(), device_free_bytes));
  TIERD_LOG(INFO) << "device " << daemon->device_->Describe() << ", host cache budget "
                  << FormatByteSize(options.host_cache_bytes) << ", GPU pool budget "
                  << FormatByteSize(options.gpu_pool_bytes);
  RETURN_IF_ERROR(daemon->StartStorage());
  // The session socket first: a client that finds the gRPC calls answering also finds it.
  SessionOptions session = SessionOptionsFor(*daemon->device_, options);
  session.counters = &daemon->counters_;
  // The default group's sessions only: the node's daemons ask each other on the main sockets.
  session.host_lender = daemon->host_lender_.get();
  if (!options.session_socket_path.empty()) {
    const SessionSocketOptions serving = daemon->SessionSocketServing();
    ASSIGN_OR_RETURN(
        daemon->session_server_,
        SessionSocketServer::Start(options.session_socket_path, group, *daemon->gpu_tier_, session,
                                   serving, daemon->unread_answers_));
    TIERD_LOG(INFO) << "serving sessions on " << options.session_socket_path << " with "
                    << serving.threads << " thread(s)"
                    << (serving.busy_poll > absl::ZeroDuration()
                            ? absl::StrCat(", polling ", absl::FormatDuration(serving.busy_poll),
                                           " after serving")
                            : "");
  }
  RETURN_IF_ERROR(daemon->StartClientGroupSockets(session));
  daemon->service_->Attach(daemon->storage_->catalog(), daemon->storage_->host_cache(),
                           *daemon->gpu_tier_, daemon->ClientGroupTiers(), session,
                           daemon->unread_answers_,
                           NodeParts{daemon->node_host_tier_.get(), daemon->host_lender_.get()});
  TIERD_LOG(INFO) << "answers clients have not read may take up to "
                  << FormatByteSize(options.max_unread_answer_bytes) << " ("
                  << FormatByteSize(daemon->unread_answers_.per_connection_limit())
                  << " per session)";
  // The monitor's first round checks the device, turns health SERVING and takes the counters'
  // first sample (the baseline of the first rates). Sampling the counters takes every tier's lock:
  // it is also the monitor's probe that the tiers still answer.
  HealthMonitorOptions monitor;
  monitor.period = options.health_check_period;
  monitor.probe_tiers = [raw = daemon.get()] { raw->SampleCounters(); };
  monitor.report = [raw = daemon.get()](bool healthy) { raw->ReportDeviceHealth(healthy); };
  monitor.heartbeat = options.heartbeat;
  daemon->monitor_ = std::make_unique<HealthMonitor>(*daemon->device_, std::move(monitor));
  RETURN_IF_ERROR(daemon->StartMetrics());
  TIERD_LOG(INFO) << "serving on unix:" << options.socket_path;
  return daemon;
}

Daemon::Daemon(DaemonOptions options, int state_lock_fd, std::optional<gid_t> socket_group)
    : options_(std::move(options)),
      socket_group_(socket_group),
      unread_answers_(options_.max_unread_answer_bytes),
      state_lock_fd_(state_lock_fd),
      service_(std::make_unique<TierdService>(&counters_)) {}

absl::Status Daemon::StartGrpcServer() {
  const std::string starting = StartingSocketPath(options_.socket_path);
  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's built-in health service encodes its messages without protobuf descriptors, so
  // reflection could list it but not describe it, and grpcurl could not call it. Touching the
  // generated descriptor links it in and registers it with the pool reflection serves from.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", starting), grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  // A registration of a large mixture of experts names a range of a checkpoint tensor for every
  // expert of every layer (RegisterModelRequest.derived): 3 MiB for DeepSeek-V3, 5 MiB for 384
  // experts in 61 layers; gRPC's default of 4 MiB is too little. Every other request is far
  // smaller, so this bounds only what a client could make the daemon buffer per call.
  builder.SetMaxReceiveMessageSize(16 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.socket_path));
  }
  // The default health service starts out SERVING; nobody can connect under the temporary name.
  server_->GetHealthCheckService()->SetServingStatus(false);
  absl::Status access = SetSocketAccess(starting, socket_group_);
  if (access.ok() && ::rename(starting.c_str(), options_.socket_path.c_str()) != 0) {
    access = PosixError(absl::StrCat("renaming ", starting, " to ", options_.socket_path), errno);
  }
  if (!access.ok()) ::unlink(starting.c_str());  // Shutdown removes only the final name
  return access;
}

absl::Status Daemon::StartStorage() {
  ASSIGN_OR_RETURN(ModelRoots roots, ModelRoots::Create(options_.model_roots));
  if (roots.confined()) {
    TIERD_LOG(INFO) << "models are registered only from "
                    << absl::StrJoin(options_.model_roots, ", ");
  } else {
    TIERD_LOG(INFO) << "models may be registered from any directory (--model-roots confines them)";
  }
  StorageStackOptions storage;
  storage.state_dir = options_.state_dir;
  storage.spill_dir = options_.spill_dir;
  storage.model_roots = std::move(roots);
  storage.max_tensors_per_model = options_.max_tensors_per_model;
  storage.arena = {options_.host_cache_bytes, options_.pin_piece_bytes};
  storage.arena.pin_threads = options_.pin_threads;
  // The node's other daemons map it to copy the objects homed here.
  storage.arena.shared = SharesHostTier(options_);
  storage.reader = options_.reader;
  storage.host_cache.policy = options_.host_cache_policy;
  storage.host_cache.compress_weights = options_.compress_weights;
  storage.host_cache.compress_threads = options_.compress_threads;
  storage.file_system = options_.file_system;
  ASSIGN_OR_RETURN(storage.remote, RemoteSourceOptions(options_));
  storage.remote_reader.streams = options_.remote.streams;
  storage.remote_reader.part_bytes = options_.remote.part_bytes;
  if (options_.remote.host_streams > 0) {
    const std::string& socket = options_.socket_path;
    const size_t slash = socket.rfind('/');
    storage.remote_reader.host_streams_file = absl::StrCat(
        slash == std::string::npos ? "." : socket.substr(0, slash), "/tierd-remote-streams.lock");
    storage.remote_reader.host_streams = options_.remote.host_streams;
  }
  if (!options_.remote.cache_dir.empty()) {
    RemoteCacheOptions& cache = storage.remote_cache.emplace();
    cache.directory = options_.remote.cache_dir;
    cache.budget_bytes = options_.remote.cache_bytes;
  }
  std::vector<DurableRecord> durable_objects;
  ASSIGN_OR_RETURN(storage_, StorageStack::Create(*device_, storage, &durable_objects));
  TIERD_LOG(INFO) << "catalog: " << storage_->catalog().model_count() << " model(s) registered";
  const HostArena& arena = storage_->arena();
  TIERD_LOG(INFO) << "host arena: " << FormatByteSize(arena.pinned_bytes()) << " of "
                  << FormatByteSize(arena.capacity()) << " pinned so far"
                  << (arena.pin_threads() > 0
                          ? absl::StrCat("; the rest pins in the background on ",
                                         arena.pin_threads(), " thread(s)")
                          : "");
  return StartGpuTiers(std::move(durable_objects));
}

absl::Status Daemon::StartGpuTiers(std::vector<DurableRecord> durable_objects) {
  GpuTierOptions gpu;
  gpu.pool_bytes = options_.gpu_pool_bytes;
  gpu.slab_bytes = options_.gpu_slab_bytes;
  gpu.durable_store = storage_->durable();
  gpu.max_clients = options_.max_sessions;
  gpu.handoff_buffer_bytes = options_.peer_host_buffer_bytes;
  // Each tier (the default group's, and each client group's) has events of its own, and an equal
  // share of --max-events: a handle sent to one group's session never names another's event.
  gpu.max_events = EventShare(options_);
  gpu.done_events_per_client = options_.session_done_events;
  gpu.check_decodes_before_serving = options_.check_decodes_before_serving;
  gpu.copy_while_reading = options_.copy_while_reading;
  gpu.decode_scratch_bytes = options_.decode_scratch_bytes;
  if (!options_.peer_sockets.empty()) {
    PeerDaemonsOptions peers{
        options_.peer_sockets, options_.socket_path, options_.peer_copy,
        absl::StrCat("tierd peer (", device_->Describe(), ", ", options_.socket_path, ")")};
    peers.node_daemon = SharesHostTier(options_);
    peers.answer_timeout = options_.node_home_timeout;
    ASSIGN_OR_RETURN(peers_, PeerDaemons::Create(*device_, std::move(peers)));
    TIERD_LOG(INFO) << "peers: " << absl::StrJoin(peers_->sockets(), ", ")
                    << " (copies: " << PeerCopyPathName(options_.peer_copy) << ")";
  }
  if (SharesHostTier(options_)) {
    // Every tier's model objects come through the node's host tier; stored objects stay local.
    host_lender_ = std::make_unique<HostLender>(storage_->catalog(), storage_->host_cache(),
                                                storage_->arena());
    local_host_ = std::make_unique<LocalHostSource>(storage_->host_cache(), storage_->arena());
    NodeHostTierOptions node;
    node.home_timeout = options_.node_home_timeout;
    node_host_tier_ = std::make_unique<NodeHostTier>(
        storage_->catalog(), *local_host_, *peers_,
        NodeHomes(options_.peer_sockets, options_.socket_path), node);
    gpu.host_source = node_host_tier_.get();
    TIERD_LOG(INFO) << "node host tier: " << node_host_tier_->homes().members().size()
                    << " daemons; model objects homed elsewhere are copied from their home's "
                    << "host arena (" << storage_->arena().shared_memory_name() << " here)";
  }
  GpuTierOptions own_groups = gpu;  // client groups' tiers do not ask peers
  gpu.peers = peers_.get();
  gpu.retained_budget_bytes = options_.retain_bytes.value_or(options_.gpu_pool_bytes / 2);
  gpu.retained_state_file = RetainedStateFile(options_.state_dir, "default");
  ASSIGN_OR_RETURN(gpu_tier_, GpuTier::Create(*device_, storage_->catalog(), storage_->arena(),
                                              storage_->host_cache(), gpu));
  TIERD_LOG(INFO) << "GPU staging pool: " << FormatByteSize(gpu_tier_->pool().capacity()) << " in "
                  << gpu_tier_->pool().slab_count() << " slab(s)";
  for (ClientGroup& group : client_groups_) {
    GpuTierOptions own = own_groups;
    own.pool_bytes = group.options.gpu_pool_bytes;
    own.stored_key_prefix = ClientGroupKeyPrefix(group.options.name);
    own.retained_budget_bytes =
        group.options.retain_bytes.value_or(group.options.gpu_pool_bytes / 2);
    own.retained_state_file = RetainedStateFile(options_.state_dir, group.options.name);
    absl::StatusOr<std::unique_ptr<GpuTier>> tier = GpuTier::Create(
        *device_, storage_->catalog(), storage_->arena(), storage_->host_cache(), own);
    if (!tier.ok()) {
      return absl::Status(tier.status().code(), absl::StrCat("client group ", group.options.name,
                                                             ": ", tier.status().message()));
    }
    group.tier = *std::move(tier);
    TIERD_LOG(INFO) << "client group " << group.options.name << ": GPU staging pool "
                    << FormatByteSize(group.tier->pool().capacity()) << " in "
                    << group.tier->pool().slab_count() << " slab(s) of its own";
  }
  // Durable objects come back on disk only; the first fetch reads and verifies them. Each goes to
  // the tier whose key prefix it carries.
  uint64_t durable_bytes = 0;
  size_t unclaimed = 0;
  for (DurableRecord& record : durable_objects) {
    // The key within its group: a group's objects carry its prefix in the durable store.
    absl::string_view key = record.key;
    GpuTier* owner = gpu_tier_.get();
    if (absl::StartsWith(key, "@")) {
      owner = nullptr;
      for (ClientGroup& group : client_groups_) {
        if (absl::ConsumePrefix(&key, group.tier->stored_key_prefix())) owner = group.tier.get();
        if (owner != nullptr) break;
      }
    }
    if (owner != nullptr && storage_->catalog().InModelNamespace(key)) {
      // Stored before its namespace became a registered model's (the registration's purge did
      // not reach it): never adopted, never served as the model's weights.
      TIERD_LOG(WARNING) << "durable object " << record.key
                         << " is under a registered model's name; removing it";
      (void)storage_->durable()->RemoveAndWait(record.key);
      continue;
    }
    RETURN_IF_ERROR(storage_->host_cache().AdoptDurable(record));
    durable_bytes += record.size;
    if (owner == nullptr) {
      ++unclaimed;
      continue;
    }
    owner->AdoptStored(std::string(key), record.size, std::move(record.tensors));
  }
  TIERD_LOG(INFO) << "durable objects: " << durable_objects.size() << " ("
                  << FormatByteSize(durable_bytes) << ") in " << storage_->durable()->directory();
  if (unclaimed > 0) {
    TIERD_LOG(WARNING) << unclaimed
                       << " durable object(s) belong to client groups this daemon does not have "
                          "(--client-groups): kept on disk, not served";
  }
  // Now that every tier has its stored objects, the sets retained before a restart come back.
  gpu_tier_->retained().Restore();
  for (ClientGroup& group : client_groups_) group.tier->retained().Restore();
  return absl::OkStatus();
}

SessionSocketOptions Daemon::SessionSocketServing() const {
  SessionSocketOptions serving;
  serving.threads =
      options_.session_threads > 0 ? options_.session_threads : DefaultSessionThreads();
  serving.busy_poll = options_.session_busy_poll;
  return serving;
}

absl::Status Daemon::StartClientGroupSockets(SessionOptions session) {
  session.host_lender = nullptr;  // a group's clients are not the node's daemons
  for (ClientGroup& group : client_groups_) {
    const std::string path = ClientGroupSocketPathFor(options_.socket_path, group.options.name);
    ASSIGN_OR_RETURN(group.sessions,
                     SessionSocketServer::Start(path, group.gid, *group.tier, session,
                                                SessionSocketServing(), unread_answers_));
    TIERD_LOG(INFO) << "client group " << group.options.name << ": sessions on " << path
                    << " (group " << group.options.unix_group << ", mode 0660)";
  }
  return absl::OkStatus();
}

std::vector<NamedGpuTier> Daemon::ClientGroupTiers() const {
  std::vector<NamedGpuTier> tiers;
  for (const ClientGroup& group : client_groups_) {
    if (group.tier != nullptr) tiers.push_back({group.options.name, group.tier.get()});
  }
  return tiers;
}

absl::Status Daemon::StartMetrics() {
  if (!options_.metrics_port.has_value()) return absl::OkStatus();
  const std::string address =
      options_.metrics_address.empty() ? kDefaultMetricsAddress : options_.metrics_address;
  ASSIGN_OR_RETURN(metrics_, MetricsServer::Start(address, *options_.metrics_port,
                                                  [this] { return RenderMetrics(); }));
  TIERD_LOG(INFO) << "metrics on http://"
                  << (absl::StrContains(address, ':') ? absl::StrCat("[", address, "]") : address)
                  << ":" << metrics_->port() << "/metrics";
  return absl::OkStatus();
}

void Daemon::ReportDeviceHealth(bool healthy) {
  absl::MutexLock lock(&health_mu_);
  if (shutting_down_) return;
  serving_ = healthy;
  server_->GetHealthCheckService()->SetServingStatus(healthy);
}

void Daemon::SampleCounters() {
  const v1::Stats stats =
      CollectStats(storage_->catalog(), storage_->host_cache(), *gpu_tier_, ClientGroupTiers(), "",
                   NodeParts{node_host_tier_.get(), host_lender_.get()});
  const absl::Time now = absl::Now();
  throughput_.Sample(now, StageBytes(stats));
  pressure_.Observe(now, stats,
                    counters_.Snapshot()[static_cast<int>(absl::StatusCode::kResourceExhausted)]);
}

std::string Daemon::RenderMetrics() {
  MetricsSnapshot snapshot;
  snapshot.serving = serving_;
  snapshot.stats =
      CollectStats(storage_->catalog(), storage_->host_cache(), *gpu_tier_, ClientGroupTiers(),
                   device_->Describe(), NodeParts{node_host_tier_.get(), host_lender_.get()});
  snapshot.stage_rates = throughput_.Rates();
  snapshot.responses = counters_.Snapshot();
  return RenderPrometheusText(snapshot);
}

Daemon::~Daemon() {
  Shutdown(absl::ZeroDuration());
  // Each step is logged at --v=1: a teardown that hangs (tierd's main bounds it) says where.
  const auto step = [](const char* what) { TIERD_VLOG(1) << "teardown: " << what; };
  step("metrics, monitor, servers");
  metrics_.reset();
  monitor_.reset();
  session_server_.reset();
  for (ClientGroup& group : client_groups_) group.sessions.reset();
  server_.reset();
  service_.reset();
  step("GPU tiers");
  bool never_idle = gpu_tier_ != nullptr && gpu_tier_->device_may_never_idle();
  for (ClientGroup& group : client_groups_) {
    never_idle = never_idle || (group.tier != nullptr && group.tier->device_may_never_idle());
    group.tier.reset();
  }
  gpu_tier_.reset();
  step("peer sessions");
  node_host_tier_.reset();
  local_host_.reset();
  peers_.reset();
  // What the lender lets go must not be read into again while a peer may still copy from it:
  // the host cache serves nothing more first.
  if (host_lender_ != nullptr) storage_->host_cache().StopServing();
  host_lender_.reset();
  step("host cache");
  if (storage_ != nullptr) storage_->StopIo();
  if (never_idle) {
    // Unregistering pinned memory and destroying the device wait for the device to go idle, which
    // a dead client's queued work may keep it from ever doing; the process's exit frees both.
    TIERD_LOG(WARNING) << "teardown: the host arena and the device are left to the process's exit";
    if (storage_ != nullptr) storage_->AbandonArena();
    storage_.reset();
    LeakOnPurpose(device_);
  } else {
    step("host arena");
    storage_.reset();
    step("device");
    device_.reset();
  }
  step("done");
  ::close(state_lock_fd_);
}

void Daemon::Shutdown(absl::Duration grace) {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_ || server_ == nullptr) return;  // done, or the gRPC server never started
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + grace;
  {
    absl::MutexLock lock(&health_mu_);
    shutting_down_ = true;
    serving_ = false;
    server_->GetHealthCheckService()->SetServingStatus(false);
  }
  service_->StartShutdown();
  // Nothing waits on an object store from here on: remote reads in flight and queued fail now,
  // and the sessions waiting on them get their answers.
  if (storage_ != nullptr) storage_->StopRemote();
  if (session_server_ != nullptr) session_server_->StopAccepting();
  for (ClientGroup& group : client_groups_) {
    if (group.sessions != nullptr) group.sessions->StopAccepting();
  }
  // grpc::Server::Shutdown is idempotent and thread-safe.
  server_->Shutdown(absl::ToChronoTime(deadline));
  // Sessions on the session socket get what is left of the grace.
  if (session_server_ != nullptr) session_server_->Shutdown(deadline);
  for (ClientGroup& group : client_groups_) {
    if (group.sessions != nullptr) group.sessions->Shutdown(deadline);
  }
  ::unlink(options_.socket_path.c_str());
}

}  // namespace tierd
