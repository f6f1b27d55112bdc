#include "server/tierd_service.h"

#include <limits.h>

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/quote.h"
#include "remote/s3_location.h"
#include "server/proto_convert.h"
#include "server/session_reactor.h"
#include "server/stats.h"

namespace tierd {
namespace {

// A Session refused at once (the daemon is starting or shutting down).
class RefusedSession final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedSession(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Registers a model on the admin thread, writing one progress message per file. The admin thread
// may block on a write (never a gRPC thread); a client gone mid-way stops the messages, not the
// registration.
class RegisterReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `registered` runs once the model is registered, before the answer.
  RegisterReactor(Catalog& catalog, TimerThread& admin, v1::RegisterModelRequest request,
                  std::function<void(const std::string& name)> registered,
                  std::function<grpc::Status(const absl::Status&)> answer)
      : catalog_(catalog),
        request_(std::move(request)),
        registered_(std::move(registered)),
        answer_(std::move(answer)) {
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
    // Everything the client sent is checked before any of it reaches the log, and is quoted
    // there and in errors: a name or path may hold newlines, NULs or a megabyte.
    absl::StatusOr<ModelSummary> summary = Check();
    absl::StatusOr<std::vector<DerivedTensorSpec>> derived = FromProto(request_.derived());
    if (summary.ok() && !derived.ok()) summary = derived.status();
    if (summary.ok()) {
      const Grouping grouping = *FromProto(request_.grouping());
      TIERD_LOG(INFO) << "registering model " << request_.name() << " from "
                      << Quote(request_.directory()) << " (" << GroupingName(grouping)
                      << (request_.verify() ? ", verifying every object" : "")
                      << (request_.keep_raw() ? ", kept raw in host memory" : "") << ")";
      summary = catalog_.RegisterModel(
          request_.name(), request_.directory(), grouping, GroupingRules::Defaults(),
          [this](const RegistrationProgress& progress) {
            v1::RegisterModelProgress message;
            message.set_files_done(progress.files_done);
            message.set_files_total(progress.files_total);
            message.set_current_file(progress.current_file);
            message.set_bytes_verified(progress.bytes_verified);
            message.set_bytes_to_verify(progress.bytes_to_verify);
            Write(message);
          },
          request_.verify(), *derived, request_.keep_raw());
    }
    if (!summary.ok()) {
      TIERD_LOG(WARNING) << "registering " << Quote(request_.name())
                         << " failed: " << summary.status();
      Finish(answer_(summary.status()));
      return;
    }
    TIERD_LOG(INFO) << "registered model " << summary->name << ": " << summary->objects
                    << " objects, " << summary->tensors << " tensors in " << summary->files
                    << " file(s)"
                    << (summary->derived_tensors > 0
                            ? absl::StrCat(", ", summary->derived_tensors,
                                           " of the tensors derived from the checkpoint's")
                            : "");
    registered_(summary->name);
    v1::RegisterModelProgress last;
    last.set_files_done(summary->files);
    last.set_files_total(summary->files);
    ToProto(*summary, last.mutable_summary());
    Write(last);
    Finish(answer_(absl::OkStatus()));
  }

  // The request's own checks, before anything is logged or read: an error, or OK (as a summary
  // that is never used) to go on.
  absl::StatusOr<ModelSummary> Check() const {
    if (absl::Status name = ValidateModelName(request_.name()); !name.ok()) return name;
    if (absl::StatusOr<Grouping> grouping = FromProto(request_.grouping()); !grouping.ok()) {
      return grouping.status();
    }
    const std::string& directory = request_.directory();
    if (IsS3Path(directory)) {
      // A model in object storage: the catalog checks the URL and the roots.
    } else if (directory.empty() || directory.front() != '/') {
      // A relative path would be resolved against the daemon's working directory, not the
      // caller's; the client libraries send absolute ones.
      return absl::InvalidArgumentError(absl::StrCat(
          "register.directory must be an absolute path or an s3:// URL, not ", Quote(directory)));
    }
    if (directory.size() >= PATH_MAX || directory.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("register.directory ", Quote(directory),
                                                     " is not a path (longer than ", PATH_MAX - 1,
                                                     " bytes, or holding a NUL byte)"));
    }
    return ModelSummary();
  }

  // Writes `message` and waits until the write is done (or the client is gone).
  void Write(const v1::RegisterModelProgress& message) {
    absl::MutexLock lock(&mu_);
    if (client_gone_) return;
    if (absl::Status serialized = Serialize(message, message_); !serialized.ok()) {
      TIERD_LOG(WARNING) << "registration progress not sent: " << serialized;
      return;
    }
    writing_ = true;
    StartWrite(&message_);
    mu_.Await(absl::Condition(
        +[](bool* writing) { return !*writing; }, &writing_));
  }

  Catalog& catalog_;
  const v1::RegisterModelRequest request_;
  const std::function<void(const std::string& name)> registered_;
  const std::function<grpc::Status(const absl::Status&)> answer_;
  absl::Mutex mu_;
  grpc::ByteBuffer message_;  // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

TierdService::TierdService(ResponseCounters* counters) : counters_(counters) {}

TierdService::~TierdService() = default;

void TierdService::Attach(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
                          std::vector<NamedGpuTier> client_groups, SessionOptions session_options,
                          UnreadAnswerBudget& unread_answers, NodeParts node) {
  attached_.reset(new Tiers{catalog, host_cache, gpu_tier, std::move(client_groups),
                            std::move(session_options), unread_answers, node});
  tiers_.store(attached_.get(), std::memory_order_release);
}

absl::StatusOr<TierdService::Tiers*> TierdService::Serving(bool during_shutdown) const {
  Tiers* tiers = tiers_.load(std::memory_order_acquire);
  if (tiers == nullptr) {
    return absl::UnavailableError("tierd is starting (its health check says when it serves)");
  }
  if (shutting_down_ && !during_shutdown) return absl::UnavailableError("tierd is shutting down");
  return tiers;
}

grpc::Status TierdService::Answer(const absl::Status& status) const {
  if (counters_ != nullptr) counters_->Count(status.code());
  return ToGrpcStatus(status);
}

template <typename Request, typename Response>
grpc::ServerUnaryReactor* TierdService::Serve(
    const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
    void (TierdService::*handle)(UnaryCall<Request, Response>&)) {
  return UnaryCall<Request, Response>::Serve(
      *request, response, counters_,
      [this, handle](UnaryCall<Request, Response>& call) { (this->*handle)(call); });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TierdService::Session(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<Tiers*> tiers = Serving();
  if (!tiers.ok()) return new RefusedSession(Answer(tiers.status()));
  return new SessionReactor(context, (*tiers)->gpu_tier, (*tiers)->session_options,
                            (*tiers)->unread_answers);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TierdService::RegisterModel(
    grpc::CallbackServerContext* /*context*/, const grpc::ByteBuffer* raw_request) {
  class Refused final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
   public:
    explicit Refused(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  v1::RegisterModelRequest request;
  if (absl::Status parsed = ParseRequest(*raw_request, request); !parsed.ok()) {
    return new Refused(Answer(parsed));
  }
  absl::StatusOr<Tiers*> tiers = Serving();
  if (!tiers.ok()) return new Refused(Answer(tiers.status()));
  return new RegisterReactor(
      (*tiers)->catalog, admin_, std::move(request),
      [tiers = *tiers](const std::string& name) {
        // The model's namespace names its weights from now on: stored objects clients put there
        // before are forgotten by every group's tier, never served as its weights.
        size_t forgotten = tiers->gpu_tier.ForgetStoredUnder(name);
        for (const NamedGpuTier& group : tiers->client_groups) {
          forgotten += group.tier->ForgetStoredUnder(name);
        }
        if (forgotten > 0) {
          TIERD_LOG(WARNING) << "model " << name << " registered over " << forgotten
                             << " stored object(s) under " << name
                             << "/: they are forgotten (keys in a model's namespace name its "
                                "weights only)";
        }
      },
      [this](const absl::Status& status) { return Answer(status); });
}

grpc::ServerUnaryReactor* TierdService::ListModels(grpc::CallbackServerContext* /*context*/,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return Serve(request, response, &TierdService::HandleListModels);
}

grpc::ServerUnaryReactor* TierdService::ListObjects(grpc::CallbackServerContext* /*context*/,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Serve(request, response, &TierdService::HandleListObjects);
}

grpc::ServerUnaryReactor* TierdService::DropModel(grpc::CallbackServerContext* /*context*/,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return Serve(request, response, &TierdService::HandleDropModel);
}

grpc::ServerUnaryReactor* TierdService::Prefetch(grpc::CallbackServerContext* /*context*/,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return Serve(request, response, &TierdService::HandlePrefetch);
}

grpc::ServerUnaryReactor* TierdService::Evict(grpc::CallbackServerContext* /*context*/,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  return Serve(request, response, &TierdService::HandleEvict);
}

grpc::ServerUnaryReactor* TierdService::GetStats(grpc::CallbackServerContext* /*context*/,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return Serve(request, response, &TierdService::HandleGetStats);
}

grpc::ServerUnaryReactor* TierdService::ListHandles(grpc::CallbackServerContext* /*context*/,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return Serve(request, response, &TierdService::HandleListHandles);
}

void TierdService::HandleListModels(
    UnaryCall<v1::ListModelsRequest, v1::ListModelsResponse>& call) {
  absl::StatusOr<Tiers*> tiers = Serving(/*during_shutdown=*/true);
  if (!tiers.ok()) return call.Answer(tiers.status());
  for (const ModelSummary& summary : (*tiers)->catalog.ListModels()) {
    ToProto(summary, call.response()->add_models());
  }
  call.Answer(absl::OkStatus());
}

void TierdService::HandleListObjects(
    UnaryCall<v1::ListObjectsRequest, v1::ListObjectsResponse>& call) {
  absl::StatusOr<Tiers*> tiers = Serving(/*during_shutdown=*/true);
  if (!tiers.ok()) return call.Answer(tiers.status());
  absl::StatusOr<std::shared_ptr<const ModelInfo>> model =
      (*tiers)->catalog.GetModel(call.request().model());
  if (!model.ok()) return call.Answer(model.status());
  for (const ObjectInfo& object : (*model)->objects) {
    v1::ObjectInfo* info = call.response()->add_objects();
    info->set_key(absl::StrCat((*model)->name, "/", object.name));
    info->set_size(object.size);
    for (const TensorPlacement& tensor : object.tensors) ToProto(tensor, info->add_tensors());
    info->set_on_gpu((*tiers)->gpu_tier.IsOnGpu(info->key()));
    info->set_host_bytes((*tiers)->host_cache.ResidentBytes(info->key()));
    info->set_in_host_cache(info->host_bytes() > 0);
    if (const NodeHostTier* node = (*tiers)->node.tier; node != nullptr) {
      info->set_home(node->homes().HomeOf(info->key()));
    }
  }
  call.Answer(absl::OkStatus());
}

void TierdService::HandleDropModel(UnaryCall<v1::DropModelRequest, v1::DropModelResponse>& call) {
  absl::StatusOr<Tiers*> tiers = Serving();
  if (!tiers.ok()) return call.Answer(tiers.status());
  // Deleting the persisted file syncs the directory: not on a gRPC thread.
  admin_.RunAfter(absl::ZeroDuration(), [tiers = *tiers, &call] {
    const std::string& name = call.request().name();
    absl::Status status = tiers->catalog.DropModel(name);
    if (status.ok()) {
      // Its objects are never served again (both tiers check the registration); free what can be.
      tiers->gpu_tier.ForgetModel(name);
      for (const NamedGpuTier& group : tiers->client_groups) group.tier->ForgetModel(name);
      TIERD_LOG(INFO) << "dropped model " << name;
    }
    call.Answer(status);
  });
}

void TierdService::HandlePrefetch(UnaryCall<v1::PrefetchRequest, v1::PrefetchResponse>& call) {
  absl::StatusOr<Tiers*> tiers = Serving();
  if (!tiers.ok()) return call.Answer(tiers.status());
  absl::StatusOr<v1::PrefetchResponse> result = RunPrefetch(
      (*tiers)->gpu_tier, call.request(), (*tiers)->session_options.max_key_bytes, "prefetch");
  if (!result.ok()) return call.Answer(result.status());
  *call.response() = *std::move(result);
  call.Answer(absl::OkStatus());
}

void TierdService::HandleEvict(UnaryCall<v1::EvictRequest, v1::EvictResponse>& call) {
  absl::StatusOr<Tiers*> tiers = Serving();
  if (!tiers.ok()) return call.Answer(tiers.status());
  absl::StatusOr<v1::EvictResponse> result = RunEvict(
      (*tiers)->gpu_tier, call.request(), (*tiers)->session_options.max_key_bytes, "evict");
  if (!result.ok()) return call.Answer(result.status());
  *call.response() = *std::move(result);
  call.Answer(absl::OkStatus());
}

void TierdService::HandleGetStats(UnaryCall<v1::GetStatsRequest, v1::Stats>& call) {
  absl::StatusOr<Tiers*> tiers = Serving(/*during_shutdown=*/true);
  if (!tiers.ok()) return call.Answer(tiers.status());
  *call.response() =
      CollectStats((*tiers)->catalog, (*tiers)->host_cache, (*tiers)->gpu_tier,
                   (*tiers)->client_groups, (*tiers)->session_options.device, (*tiers)->node);
  call.Answer(absl::OkStatus());
}

void TierdService::HandleListHandles(
    UnaryCall<v1::ListHandlesRequest, v1::ListHandlesResponse>& call) {
  absl::StatusOr<Tiers*> tiers = Serving(/*during_shutdown=*/true);
  if (!tiers.ok()) return call.Answer(tiers.status());
  v1::ListHandlesResponse* response = call.response();
  response->set_backend((*tiers)->session_options.backend);
  response->set_device_ordinal((*tiers)->session_options.device_ordinal);
  const HandleList handles = (*tiers)->gpu_tier.Handles();
  for (const StagingSlabInfo& slab : handles.slabs) ToProto(slab, response->add_handles());
  for (const EventInfo& event : handles.events) ToProto(event, response->add_handles());
  call.Answer(absl::OkStatus());
}

}  // namespace tierd
