#include "server/tierd_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "server/proto_convert.h"
#include "server/session_reactor.h"

namespace tierd {
namespace {

// A Session refused at once (the daemon is shutting down).
class RefusedSession final
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  explicit RefusedSession(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// Registers a model on the admin thread, writing one progress message per file. The admin thread
// may block on a write (never a gRPC thread); a client gone mid-way stops the messages, not the
// registration.
class RegisterReactor final : public grpc::ServerWriteReactor<v1::RegisterModelProgress> {
 public:
  RegisterReactor(Catalog& catalog, TimerThread& admin, v1::RegisterModelRequest request)
      : catalog_(catalog), request_(std::move(request)) {
    admin.RunAfter(absl::ZeroDuration(), [this] { Run(); });
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) client_gone_ = true;
  }
  void OnDone() override { delete this; }

 private:
  void Run() {
    absl::StatusOr<Grouping> grouping = FromProto(request_.grouping());
    absl::StatusOr<ModelSummary> summary = absl::UnknownError("not registered");
    if (!grouping.ok()) {
      summary = grouping.status();
    } else if (request_.directory().empty() || request_.directory().front() != '/') {
      // A relative path would be resolved against the daemon's working directory, not the
      // caller's; the client libraries send absolute ones.
      summary = absl::InvalidArgumentError(absl::StrCat(
          "register.directory must be an absolute path, not \"", request_.directory(), "\""));
    } else {
      TIERD_LOG(INFO) << "registering model " << request_.name() << " from "
                      << request_.directory() << " (" << GroupingName(*grouping) << ")";
      summary = catalog_.RegisterModel(
          request_.name(), request_.directory(), *grouping, GroupingRules::Defaults(),
          [this](const RegistrationProgress& progress) {
            v1::RegisterModelProgress message;
            message.set_files_done(progress.files_done);
            message.set_files_total(progress.files_total);
            message.set_current_file(progress.current_file);
            Write(message);
          });
    }
    if (!summary.ok()) {
      TIERD_LOG(WARNING) << "registering " << request_.name() << " failed: " << summary.status();
      Finish(ToGrpcStatus(summary.status()));
      return;
    }
    TIERD_LOG(INFO) << "registered model " << summary->name << ": " << summary->objects
                    << " objects, " << summary->tensors << " tensors in " << summary->files
                    << " file(s)";
    v1::RegisterModelProgress last;
    last.set_files_done(summary->files);
    last.set_files_total(summary->files);
    ToProto(*summary, last.mutable_summary());
    Write(last);
    Finish(grpc::Status::OK);
  }

  // Writes `message` and waits until the write is done (or the client is gone).
  void Write(const v1::RegisterModelProgress& message) {
    absl::MutexLock lock(&mu_);
    if (client_gone_) return;
    message_ = message;
    writing_ = true;
    StartWrite(&message_);
    mu_.Await(absl::Condition(
        +[](bool* writing) { return !*writing; }, &writing_));
  }

  Catalog& catalog_;
  const v1::RegisterModelRequest request_;
  absl::Mutex mu_;
  v1::RegisterModelProgress message_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

TierdService::TierdService(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
                           SessionOptions session_options)
    : catalog_(catalog),
      host_cache_(host_cache),
      gpu_tier_(gpu_tier),
      session_options_(std::move(session_options)) {}

TierdService::~TierdService() = default;

absl::Status TierdService::CheckServing() const {
  if (shutting_down_) return absl::UnavailableError("tierd is shutting down");
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* TierdService::Finish(grpc::CallbackServerContext* context,
                                               const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* TierdService::Session(
    grpc::CallbackServerContext* /*context*/) {
  if (absl::Status serving = CheckServing(); !serving.ok()) return new RefusedSession(serving);
  return new SessionReactor(gpu_tier_, session_options_);
}

grpc::ServerWriteReactor<v1::RegisterModelProgress>* TierdService::RegisterModel(
    grpc::CallbackServerContext* /*context*/, const v1::RegisterModelRequest* request) {
  if (absl::Status serving = CheckServing(); !serving.ok()) {
    class Refused final : public grpc::ServerWriteReactor<v1::RegisterModelProgress> {
     public:
      explicit Refused(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
      void OnDone() override { delete this; }
    };
    return new Refused(serving);
  }
  return new RegisterReactor(catalog_, admin_, *request);
}

grpc::ServerUnaryReactor* TierdService::ListModels(grpc::CallbackServerContext* context,
                                                   const v1::ListModelsRequest* /*request*/,
                                                   v1::ListModelsResponse* response) {
  for (const ModelSummary& summary : catalog_.ListModels()) {
    ToProto(summary, response->add_models());
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* TierdService::ListObjects(grpc::CallbackServerContext* context,
                                                    const v1::ListObjectsRequest* request,
                                                    v1::ListObjectsResponse* response) {
  absl::StatusOr<std::shared_ptr<const ModelInfo>> model = catalog_.GetModel(request->model());
  if (!model.ok()) return Finish(context, model.status());
  for (const ObjectInfo& object : (*model)->objects) {
    v1::ObjectInfo* info = response->add_objects();
    info->set_key(absl::StrCat((*model)->name, "/", object.name));
    info->set_size(object.size);
    for (const TensorPlacement& tensor : object.tensors) ToProto(tensor, info->add_tensors());
    info->set_on_gpu(gpu_tier_.IsOnGpu(info->key()));
    info->set_in_host_cache(host_cache_.IsResident(info->key()));
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* TierdService::DropModel(grpc::CallbackServerContext* context,
                                                  const v1::DropModelRequest* request,
                                                  v1::DropModelResponse* /*response*/) {
  if (absl::Status serving = CheckServing(); !serving.ok()) return Finish(context, serving);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Deleting the persisted file syncs the directory: not on a gRPC thread.
  admin_.RunAfter(absl::ZeroDuration(), [this, reactor, name = request->name()] {
    absl::Status status = catalog_.DropModel(name);
    if (status.ok()) {
      // Its objects are never served again (both tiers check the registration); free what can be.
      gpu_tier_.ForgetModel(name);
      TIERD_LOG(INFO) << "dropped model " << name;
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* TierdService::Prefetch(grpc::CallbackServerContext* context,
                                                 const v1::PrefetchRequest* request,
                                                 v1::PrefetchResponse* response) {
  if (absl::Status serving = CheckServing(); !serving.ok()) return Finish(context, serving);
  absl::StatusOr<v1::PrefetchResponse> result =
      RunPrefetch(gpu_tier_, *request, session_options_.max_key_bytes, "prefetch");
  if (!result.ok()) return Finish(context, result.status());
  *response = *std::move(result);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* TierdService::Evict(grpc::CallbackServerContext* context,
                                              const v1::EvictRequest* request,
                                              v1::EvictResponse* response) {
  if (absl::Status serving = CheckServing(); !serving.ok()) return Finish(context, serving);
  absl::StatusOr<v1::EvictResponse> result =
      RunEvict(gpu_tier_, *request, session_options_.max_key_bytes, "evict");
  if (!result.ok()) return Finish(context, result.status());
  *response = *std::move(result);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* TierdService::GetStats(grpc::CallbackServerContext* context,
                                                 const v1::GetStatsRequest* /*request*/,
                                                 v1::Stats* response) {
  const GpuTierStats gpu = gpu_tier_.stats();
  const HostCacheStats host = host_cache_.stats();
  response->set_device(session_options_.device);
  v1::TierStats* gpu_out = response->mutable_gpu();
  gpu_out->set_budget_bytes(gpu.budget_bytes);
  gpu_out->set_used_bytes(gpu.used_bytes);
  gpu_out->set_objects(gpu.objects);
  gpu_out->set_hits(gpu.hits);
  gpu_out->set_misses(gpu.misses);
  gpu_out->set_evictions(gpu.evictions);
  v1::TierStats* host_out = response->mutable_host();
  host_out->set_budget_bytes(host.capacity_bytes);
  host_out->set_used_bytes(host.used_bytes);
  host_out->set_objects(host.objects);
  host_out->set_hits(host.hits);
  host_out->set_misses(host.misses);
  host_out->set_evictions(host.evictions);
  response->set_host_pinned_bytes(host.pinned_bytes);
  response->set_stored_objects(host.stored_objects);
  response->set_spilled_objects(host.spilled_objects);
  response->set_bytes_disk_to_host(host.bytes_from_disk);
  response->set_bytes_host_to_gpu(gpu.bytes_host_to_gpu);
  response->set_bytes_gpu_to_host(gpu.bytes_gpu_to_host);
  response->set_bytes_host_to_disk(host.bytes_to_spill);
  response->set_disk_reads_in_flight(host.loading);
  response->set_copies_in_flight(gpu.copies_in_flight);
  response->set_sessions(gpu.clients);
  response->set_leases(gpu.leases);
  response->set_reservations(gpu.reservations);
  response->set_pins(gpu.pins);
  response->set_checksum_failures(host.checksum_failures);
  response->set_models(catalog_.model_count());
  response->set_slabs(gpu.slabs);
  response->set_events(gpu.events);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* TierdService::ListHandles(grpc::CallbackServerContext* context,
                                                    const v1::ListHandlesRequest* /*request*/,
                                                    v1::ListHandlesResponse* response) {
  response->set_backend(session_options_.backend);
  response->set_device_ordinal(session_options_.device_ordinal);
  const HandleList handles = gpu_tier_.Handles();
  for (const StagingSlabInfo& slab : handles.slabs) ToProto(slab, response->add_handles());
  for (const EventInfo& event : handles.events) ToProto(event, response->add_handles());
  return Finish(context, absl::OkStatus());
}

}  // namespace tierd
