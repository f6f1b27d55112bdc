#include "server/tierd_service.h"

#include <limits.h>

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/quote.h"
#include "server/proto_convert.h"
#include "server/register_reactor.h"
#include "server/session_reactor.h"
#include "server/stats.h"
#include "storage/model_location.h"

namespace tierd {
namespace {

// A Session refused at once (the daemon is starting or shutting down).
class RefusedSession final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedSession(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
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

namespace {

// Whether a registration reads from an object store (a path that is no valid location is not:
// its registration says why, on the local worker).
bool IsInObjectStore(const std::string& directory) {
  absl::StatusOr<ModelLocation> location = ParseModelLocation(directory);
  return location.ok() && location->in_object_store();
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* TierdService::RegisterModel(
    grpc::CallbackServerContext* /*context*/, const grpc::ByteBuffer* raw_request) {
  class Refused final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
   public:
    explicit Refused(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  absl::StatusOr<Tiers*> tiers = Serving();
  if (!tiers.ok()) return new Refused(Answer(tiers.status()));
  // Refused before the request is parsed: each one admitted holds its bytes until it is done.
  if (!registrations_.Admit()) {
    return new Refused(Answer(absl::ResourceExhaustedError(
        absl::StrCat(registrations_.max_admitted(),
                     " registrations are queued or running already; try again once one is done"))));
  }
  // Parsed on its worker, once its memory is held; only where it reads from is read now.
  absl::StatusOr<std::string> directory =
      PeekStringField(*raw_request, v1::RegisterModelRequest::kDirectoryFieldNumber);
  if (!directory.ok()) {
    registrations_.Leave();
    v1::RegisterModelRequest request;
    return new Refused(Answer(ParseRequest(*raw_request, request)));
  }
  return new RegisterReactor(
      (*tiers)->catalog, registrations_, *raw_request, IsInObjectStore(*directory),
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
