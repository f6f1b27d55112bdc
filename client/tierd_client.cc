#include "client/tierd_client.h"

#include <filesystem>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/health.h"
#include "common/status_macros.h"
#include "device/device_factory.h"
#include "wire/session_core.h"
#include "wire/session_socket.h"
#include "wire/wire_format.h"

namespace tierd {

// ---- Lease
// ---------------------------------------------------------------------------------------

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (valid()) Release();
    session_ = std::move(other.session_);
    lease_id_ = other.lease_id_;
    key_ = std::move(other.key_);
    data_ = other.data_;
    size_ = other.size_;
    tensors_ = std::move(other.tensors_);
    stream_ = other.stream_;
    other.session_ = nullptr;
  }
  return *this;
}

Lease::~Lease() {
  if (valid()) Release();
}

void Lease::Release(Stream& stream) {
  if (!valid()) return;
  session_->ReleaseLease(lease_id_, stream);
  session_.reset();
  data_ = nullptr;
}

void Lease::Release() {
  if (valid()) Release(*stream_);
}

// ---- Session
// -------------------------------------------------------------------------------------

// Commits sent and not yet answered, and the first failure among them.
struct SessionCommits {
  absl::Mutex mu;
  std::map<std::string, int> in_flight ABSL_GUARDED_BY(mu);  // by key
  absl::Status first_error ABSL_GUARDED_BY(mu);
};

Session::Session(std::shared_ptr<SessionCore> core)
    : core_(std::move(core)), commits_(std::make_shared<SessionCommits>()) {}

Session::~Session() {
  (void)Flush();
  default_stream_.reset();
}

Device& Session::device() { return core_->device(); }
Stream& Session::default_stream() { return *default_stream_; }
const v1::SessionOpened& Session::info() const { return opened_; }
const char* Session::transport() const { return core_->transport_kind(); }

absl::StatusOr<Lease> Session::Fetch(const std::string& key) {
  return Fetch(key, *default_stream_);
}

absl::StatusOr<Lease> Session::Fetch(const std::string& key, Stream& stream) {
  AwaitCommitsOf(key);
  v1::SessionRequest request;
  request.mutable_fetch()->set_key(key);
  absl::StatusOr<v1::SessionResponse> response = core_->Call(std::move(request));
  if (!response.ok()) return response.status();
  return LeaseFrom(*response, stream);
}

absl::StatusOr<std::vector<Lease>> Session::FetchMany(const std::vector<std::string>& keys,
                                                      Stream& stream, std::vector<Lease> release) {
  std::vector<uint64_t> released;
  for (Lease& lease : release) {
    if (!lease.valid()) continue;
    if (lease.session_ != core_) {
      lease.Release(stream);
      continue;
    }
    released.push_back(lease.lease_id_);
    lease.session_.reset();  // released below, or held until the session ends
    lease.data_ = nullptr;
  }
  std::vector<v1::SessionRequest> releases = core_->PrepareReleases(released, stream);
  std::vector<v1::SessionRequest> fetches(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    AwaitCommitsOf(keys[i]);
    fetches[i].mutable_fetch()->set_key(keys[i]);
  }
  std::vector<absl::StatusOr<v1::SessionResponse>> answers =
      core_->CallMany(std::move(releases), std::move(fetches));
  std::vector<Lease> leases;
  leases.reserve(keys.size());
  absl::Status first_failure;
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<Lease> lease =
        answers[i].ok() ? LeaseFrom(*answers[i], stream) : answers[i].status();
    if (lease.ok()) {
      leases.push_back(*std::move(lease));
    } else if (first_failure.ok()) {
      first_failure = absl::Status(lease.status().code(),
                                   absl::StrCat(keys[i], ": ", lease.status().message()));
    }
  }
  if (!first_failure.ok()) return first_failure;  // `leases` release themselves
  return leases;
}

void Session::AwaitCommitsOf(const std::string& key) {
  std::pair<SessionCommits*, const std::string*> args(commits_.get(), &key);
  absl::MutexLock lock(&commits_->mu);
  commits_->mu.Await(absl::Condition(
      +[](std::pair<SessionCommits*, const std::string*>* args) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return args->first->in_flight.count(*args->second) == 0;
      },
      &args));
}

absl::StatusOr<Lease> Session::LeaseFrom(v1::SessionResponse& response, Stream& stream) {
  v1::Lease& granted = *response.mutable_lease();
  Lease lease;
  lease.session_ = core_;
  lease.lease_id_ = granted.lease_id();
  lease.key_ = granted.key();
  lease.size_ = granted.length();
  // Moved out of the answer, not copied: an index can hold thousands of tensors.
  lease.tensors_.assign(std::make_move_iterator(granted.mutable_tensors()->begin()),
                        std::make_move_iterator(granted.mutable_tensors()->end()));
  lease.stream_ = &stream;
  // The thread that read the answer opened its handles; a lookup fails only when the daemon named
  // one it never sent (the lease is then released unread).
  absl::StatusOr<Slab*> slab = core_->slab(granted.slab_id());
  if (!slab.ok()) return slab.status();
  if (granted.offset() + granted.length() > (*slab)->size()) {
    return absl::InternalError(
        absl::StrCat("lease of ", lease.key_, " lies outside slab ", granted.slab_id()));
  }
  if (granted.has_ready_event_id()) {
    // The copy into staging may still run: the stream waits for it, not the CPU.
    absl::StatusOr<Event*> ready = core_->event(granted.ready_event_id());
    if (!ready.ok()) return ready.status();
    if (absl::Status wait = core_->device().WaitEvent(stream, **ready); !wait.ok()) return wait;
  }
  lease.data_ = static_cast<uint8_t*>((*slab)->data()) + granted.offset();
  return lease;
}

absl::Status Session::Prefetch(const std::vector<std::string>& keys, absl::Duration deadline) {
  v1::SessionRequest request;
  for (const std::string& key : keys) request.mutable_prefetch()->add_keys(key);
  request.mutable_prefetch()->set_deadline_ms(absl::ToInt64Milliseconds(deadline));
  return core_->Call(std::move(request)).status();
}

absl::Status Session::StoreAsync(const StoreRequest& request) {
  return StoreAsync(request, *default_stream_);
}

absl::Status Session::StoreAsync(const StoreRequest& store, Stream& stream) {
  v1::SessionRequest request;
  v1::ReserveRequest* reserve = request.mutable_reserve();
  reserve->set_key(store.key);
  reserve->set_length(store.size);
  reserve->set_spillable(store.spillable);
  reserve->set_durable(store.durable);
  for (const v1::TensorInfo& tensor : store.tensors) *reserve->add_tensors() = tensor;
  absl::StatusOr<v1::SessionResponse> response = core_->Call(std::move(request));
  if (!response.ok()) return response.status();
  const v1::Reservation& reservation = response->reservation();
  v1::SessionRequest commit;
  commit.mutable_commit()->set_reservation_id(reservation.reservation_id());
  // The thread that read the answer opened its handles.
  absl::StatusOr<Slab*> slab = core_->slab(reservation.slab_id());
  absl::Status status = slab.status();
  if (status.ok()) {
    uint8_t* dst = static_cast<uint8_t*>((*slab)->data()) + reservation.offset();
    status = core_->device().CopyAsync(stream, dst, store.data, store.size);
  }
  if (status.ok()) {
    absl::StatusOr<std::optional<uint32_t>> written =
        core_->RecordDone(stream, "reservation", reservation.reservation_id());
    // Without a record or a finished stream the writes may still run: neither commit nor abort,
    // the reservation is freed when the session ends.
    if (!written.ok()) return written.status();
    if (written->has_value()) commit.mutable_commit()->set_written_event_id(**written);
  } else {
    // Give the reservation back, once nothing of ours can still write into it.
    (void)core_->device().SynchronizeStream(stream);
    commit.mutable_commit()->set_abort(true);
    (void)core_->Send(std::move(commit));
    return status;
  }
  {
    absl::MutexLock lock(&commits_->mu);
    ++commits_->in_flight[store.key];
  }
  return core_->Send(std::move(commit), [commits = commits_,
                                         key = store.key](const v1::SessionResponse& answer) {
    absl::MutexLock lock(&commits->mu);
    if (answer.code() != 0 && commits->first_error.ok()) {
      commits->first_error = absl::Status(static_cast<absl::StatusCode>(answer.code()),
                                          absl::StrCat("commit of ", key, ": ", answer.message()));
    }
    if (--commits->in_flight[key] == 0) commits->in_flight.erase(key);
  });
}

absl::Status Session::Flush() {
  absl::MutexLock lock(&commits_->mu);
  commits_->mu.Await(absl::Condition(
      +[](SessionCommits* commits)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return commits->in_flight.empty(); },
      commits_.get()));
  return std::exchange(commits_->first_error, absl::OkStatus());
}

absl::Status Session::Pin(const std::string& key) {
  v1::SessionRequest request;
  request.mutable_pin()->set_key(key);
  return core_->Call(std::move(request)).status();
}

absl::Status Session::Unpin(const std::string& key) {
  v1::SessionRequest request;
  request.mutable_unpin()->set_key(key);
  return core_->Call(std::move(request)).status();
}

absl::StatusOr<v1::RetainedSet> Session::Retain(const std::string& target, absl::Duration ttl) {
  if (ttl < absl::ZeroDuration()) return absl::InvalidArgumentError("ttl must not be negative");
  v1::SessionRequest request;
  request.mutable_retain()->set_target(target);
  request.mutable_retain()->set_ttl_ms(absl::ToInt64Milliseconds(ttl));
  ASSIGN_OR_RETURN(v1::SessionResponse response, core_->Call(std::move(request)));
  return response.retained();
}

absl::Status Session::Unretain(const std::string& target) {
  v1::SessionRequest request;
  request.mutable_unretain()->set_target(target);
  return core_->Call(std::move(request)).status();
}

absl::StatusOr<v1::RetainedSet> Session::Sleep(const std::string& target) {
  v1::SessionRequest request;
  request.mutable_sleep()->set_target(target);
  ASSIGN_OR_RETURN(v1::SessionResponse response, core_->Call(std::move(request)));
  return response.retained();
}

absl::StatusOr<v1::RetainedSet> Session::Wake(const std::string& target) {
  v1::SessionRequest request;
  request.mutable_wake()->set_target(target);
  ASSIGN_OR_RETURN(v1::SessionResponse response, core_->Call(std::move(request)));
  return response.retained();
}

absl::StatusOr<v1::RetainedSets> Session::ListRetained() {
  v1::SessionRequest request;
  request.mutable_list_retained();
  ASSIGN_OR_RETURN(v1::SessionResponse response, core_->Call(std::move(request)));
  return response.retained_sets();
}

absl::StatusOr<v1::EvictResponse> Session::Evict(const std::string& key_or_prefix, v1::Tier tier) {
  v1::SessionRequest request;
  request.mutable_evict()->set_key(key_or_prefix);
  request.mutable_evict()->set_tier(tier);
  absl::StatusOr<v1::SessionResponse> response = core_->Call(std::move(request));
  if (!response.ok()) return response.status();
  return response->evicted();
}

// ---- Client
// --------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.socket_path.empty()) return absl::InvalidArgumentError("no socket path");
  grpc::ChannelArguments arguments;
  // Staging handles are small, but a model's object list can be long.
  arguments.SetMaxReceiveMessageSize(64 << 20);
  // A daemon that restarts is back within seconds on the same socket: reconnect with gRPC's
  // exponential backoff, but never wait more than a second between tries (gRPC's default grows
  // to two minutes, which suits remote servers, not a local socket). GRPC_ARG_MIN_RECONNECT_
  // BACKOFF_MS is left at its default: gRPC takes it as the least time a connection attempt is
  // given to complete its handshake (20 s), and a daemon on a loaded node may take seconds to
  // answer a new connection; at 100 ms, calls failed UNAVAILABLE against a daemon that was up.
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      UnixTarget(options.socket_path), grpc::InsecureChannelCredentials(), arguments);
  return std::unique_ptr<Client>(new Client(options, v1::Tierd::NewStub(channel)));
}

Client::Client(ClientOptions options, std::unique_ptr<v1::Tierd::Stub> stub)
    : options_(std::move(options)), stub_(std::move(stub)) {}

Client::~Client() = default;

void Client::PrepareContext(grpc::ClientContext& context) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
}

absl::StatusOr<std::shared_ptr<Device>> Client::DeviceFor(const v1::SessionOpened& opened) {
  absl::MutexLock lock(&device_mu_);
  if (device_ != nullptr) return device_;
  DeviceSpec spec;
  if (opened.backend() == "host") {
    spec.kind = DeviceSpec::Kind::kHost;
  } else if (opened.backend() == "cuda") {
    spec.kind = DeviceSpec::Kind::kCuda;
    spec.ordinal = options_.cuda_ordinal.value_or(opened.device_ordinal());
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon's backend \"", opened.backend(), "\" is unknown to this client"));
  }
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(spec);
  if (!device.ok()) return device.status();
  device_ = std::shared_ptr<Device>(*std::move(device));
  return device_;
}

absl::StatusOr<std::unique_ptr<Session>> Client::OpenSession() {
  std::unique_ptr<SessionTransport> transport;
  if (!options_.client_group.empty()) {
    // Never another way in: a session elsewhere would belong to another group.
    const std::string path = ClientGroupSocketPathFor(options_.socket_path, options_.client_group);
    absl::StatusOr<std::unique_ptr<SessionTransport>> socket =
        ConnectSessionSocket(path, options_.session_busy_poll);
    if (!socket.ok()) {
      return absl::Status(
          socket.status().code(),
          absl::StrCat("client group ", options_.client_group, ": ", socket.status().message()));
    }
    transport = *std::move(socket);
  } else if (!options_.session_socket_path.empty()) {
    const std::string path = options_.session_socket_path == "default"
                                 ? SessionSocketPathFor(options_.socket_path)
                                 : options_.session_socket_path;
    // Nothing there (an older daemon, or one started without it): the gRPC stream serves.
    if (auto socket = ConnectSessionSocket(path, options_.session_busy_poll); socket.ok()) {
      transport = *std::move(socket);
    }
  }
  if (transport == nullptr) {
    absl::StatusOr<std::unique_ptr<SessionTransport>> grpc = StartGrpcSession(*stub_);
    if (!grpc.ok()) return grpc.status();
    transport = *std::move(grpc);
  }
  std::shared_ptr<SessionCore> core = SessionCore::Start(std::move(transport));
  v1::SessionRequest open;
  open.mutable_open()->set_client_name(options_.client_name);
  open.mutable_open()->set_protocol(SessionProtocolVersion());
  absl::StatusOr<v1::SessionResponse> opened = core->Call(std::move(open));
  if (!opened.ok()) {
    // A session that ended before it opened: the transport's reason is the error, naming the socket
    // as any call's does (gRPC: "failed to connect to all addresses; ... unix:PATH: ..."), or the
    // daemon's refusal ("tierd is starting").
    if (absl::Status reason = core->end_reason(); core->ended() && !reason.ok()) {
      // gRPC cancels a stream the daemon stops serving (it is shutting down): as UNAVAILABLE as
      // the daemon's own refusal, and what a caller should do is the same, come back later.
      if (absl::IsCancelled(reason)) {
        return absl::UnavailableError(
            absl::StrCat(options_.socket_path, ": the session was cancelled before it opened (",
                         reason.message(), "); tierd may be shutting down"));
      }
      return reason;
    }
    return opened.status();
  }
  absl::StatusOr<std::shared_ptr<Device>> device = DeviceFor(opened->opened());
  if (!device.ok()) return device.status();
  core->set_device(*device);
  absl::StatusOr<std::unique_ptr<Stream>> stream = (*device)->CreateStream(StreamPriority::kHigh);
  if (!stream.ok()) return stream.status();
  if (absl::Status taken = core->Opened(*opened); !taken.ok()) return taken;
  std::unique_ptr<Session> session(new Session(std::move(core)));
  session->opened_ = opened->opened();
  session->default_stream_ = *std::move(stream);
  return session;
}

std::string ShardKey(const std::string& key, uint32_t dim, uint32_t index, uint32_t count,
                     const std::vector<uint32_t>& segments) {
  std::string shard = absl::StrCat(key, "@", dim, ":", index, "/", count);
  if (!segments.empty()) absl::StrAppend(&shard, ":", absl::StrJoin(segments, ","));
  return shard;
}

namespace {

// `directory` made absolute against this process's working directory: the daemon takes absolute
// paths only. Only "." parts are dropped: dropping "x/.." (lexically_normal) would skip a symlink
// x. A location in object storage (s3://) goes as it is.
absl::StatusOr<std::string> AbsoluteDirectory(const std::string& directory) {
  if (absl::StartsWith(directory, "s3://")) return directory;
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(directory, error);
  if (error) return absl::InvalidArgumentError(absl::StrCat(directory, ": ", error.message()));
  std::filesystem::path result;
  for (const std::filesystem::path& part : absolute) {
    if (part != ".") result /= part;
  }
  return result.string();
}

}  // namespace

absl::StatusOr<v1::ModelSummary> Client::RegisterModel(
    const std::string& name, const std::string& directory, v1::Grouping grouping,
    const std::function<void(const v1::RegisterModelProgress&)>& progress, bool verify) {
  v1::RegisterModelRequest request;
  request.set_name(name);
  request.set_directory(directory);
  request.set_grouping(grouping);
  request.set_verify(verify);
  return RegisterModel(std::move(request), progress);
}

absl::StatusOr<v1::ModelSummary> Client::RegisterModel(
    v1::RegisterModelRequest request,
    const std::function<void(const v1::RegisterModelProgress&)>& progress, absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::string absolute, AbsoluteDirectory(request.directory()));
  request.set_directory(std::move(absolute));
  grpc::ClientContext context;
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  std::unique_ptr<grpc::ClientReader<v1::RegisterModelProgress>> reader =
      stub_->RegisterModel(&context, request);
  v1::RegisterModelProgress message;
  std::optional<v1::ModelSummary> summary;
  while (reader->Read(&message)) {
    if (progress) progress(message);
    if (message.has_summary()) summary = message.summary();
  }
  if (absl::Status status = FromGrpcStatus(reader->Finish()); !status.ok()) return status;
  if (!summary) return absl::InternalError("the daemon sent no summary");
  return *summary;
}

template <typename Request, typename Response>
absl::StatusOr<Response> Client::Unary(grpc::Status (v1::Tierd::Stub::*rpc)(grpc::ClientContext*,
                                                                            const Request&,
                                                                            Response*),
                                       const Request& request) {
  grpc::ClientContext context;
  PrepareContext(context);
  Response response;
  RETURN_IF_ERROR(FromGrpcStatus((stub_.get()->*rpc)(&context, request, &response)));
  return response;
}

absl::StatusOr<std::vector<v1::ModelSummary>> Client::ListModels() {
  ASSIGN_OR_RETURN(v1::ListModelsResponse response,
                   Unary(&v1::Tierd::Stub::ListModels, v1::ListModelsRequest()));
  return std::vector<v1::ModelSummary>(response.models().begin(), response.models().end());
}

absl::StatusOr<std::vector<v1::ObjectInfo>> Client::ListObjects(const std::string& model) {
  v1::ListObjectsRequest request;
  request.set_model(model);
  ASSIGN_OR_RETURN(v1::ListObjectsResponse response, Unary(&v1::Tierd::Stub::ListObjects, request));
  return std::vector<v1::ObjectInfo>(response.objects().begin(), response.objects().end());
}

absl::Status Client::DropModel(const std::string& name) {
  v1::DropModelRequest request;
  request.set_name(name);
  return Unary(&v1::Tierd::Stub::DropModel, request).status();
}

absl::StatusOr<v1::PrefetchResponse> Client::Prefetch(const std::vector<std::string>& keys,
                                                      bool host_only) {
  v1::PrefetchRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  request.set_host_only(host_only);
  return Unary(&v1::Tierd::Stub::Prefetch, request);
}

absl::StatusOr<v1::EvictResponse> Client::Evict(const std::string& key_or_prefix, v1::Tier tier) {
  v1::EvictRequest request;
  request.set_key(key_or_prefix);
  request.set_tier(tier);
  return Unary(&v1::Tierd::Stub::Evict, request);
}

absl::StatusOr<std::vector<Lease>> Client::MapModel(Session& session, const std::string& model,
                                                    Stream& stream) {
  ASSIGN_OR_RETURN(std::vector<v1::ObjectInfo> objects, ListObjects(model));
  std::vector<std::string> keys;
  keys.reserve(objects.size());
  for (const v1::ObjectInfo& object : objects) keys.push_back(object.key());
  return session.FetchMany(keys, stream);
}

absl::StatusOr<v1::Stats> Client::GetStats() {
  return Unary(&v1::Tierd::Stub::GetStats, v1::GetStatsRequest());
}

}  // namespace tierd
