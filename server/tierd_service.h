// The tierd.v1.Tierd service: the Session stream (SessionReactor) and the unary calls people and
// scripts make. It is served from the daemon's first moment (answering UNAVAILABLE while the
// daemon starts) and attached to the tiers once they are ready. Handlers never block on I/O:
// registrations run on workers of their own (server/registration_queue.h), dropping models on the
// service's admin thread; everything else is in-memory bookkeeping or hands work to the tiers.
#ifndef TIERD_SERVER_TIERD_SERVICE_H_
#define TIERD_SERVER_TIERD_SERVICE_H_

#include <atomic>
#include <memory>
#include <vector>

#include "common/timer_thread.h"
#include "gpu/gpu_tier.h"
#include "server/raw_call.h"
#include "server/registration_queue.h"
#include "server/response_counters.h"
#include "server/session_protocol.h"
#include "server/stats.h"
#include "server/unread_answer_budget.h"
#include "storage/host/host_cache.h"
#include "storage/model/catalog.h"
#include "tierd/v1/tierd.grpc.pb.h"

namespace tierd {

// Every method registered raw, so that requests are parsed by the daemon (server/raw_call.h): one
// that does not parse is answered INVALID_ARGUMENT naming what is wrong, where gRPC's generated
// handlers would answer UNIMPLEMENTED with no message.
using RawTierdService =
    v1::Tierd::WithRawCallbackMethod_Session<v1::Tierd::WithRawCallbackMethod_RegisterModel<
        v1::Tierd::WithRawCallbackMethod_ListModels<v1::Tierd::WithRawCallbackMethod_ListObjects<
            v1::Tierd::WithRawCallbackMethod_DropModel<v1::Tierd::WithRawCallbackMethod_Prefetch<
                v1::Tierd::WithRawCallbackMethod_Evict<v1::Tierd::WithRawCallbackMethod_GetStats<
                    v1::Tierd::WithRawCallbackMethod_ListHandles<v1::Tierd::Service>>>>>>>>>;

class TierdService final : public RawTierdService {
 public:
  // The service starts out not serving: every call is answered UNAVAILABLE ("tierd is starting")
  // until Attach. Answers are counted in `counters` (must outlive the service; may be null).
  explicit TierdService(ResponseCounters* counters);
  // Waits for registrations in progress.
  ~TierdService() override;

  // Serves calls on these tiers from now on: `gpu_tier` is the default client group's, the one
  // sessions and calls on this service use; `client_groups` are the other groups' tiers, which
  // stats include and dropped models are removed from. Session streams charge the answers their
  // clients have not read to `unread_answers`. `node`: the node's host tier, for stats and homes.
  // The references must outlive the service. Call once.
  void Attach(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
              std::vector<NamedGpuTier> client_groups, SessionOptions session_options,
              UnreadAnswerBudget& unread_answers, NodeParts node = {});
  // From now on new sessions and calls that change state are refused with UNAVAILABLE; listing
  // and stats still answer.
  void StartShutdown() {
    shutting_down_ = true;
    registrations_.StartShutdown();
  }

  // The raw methods: each parses its request and hands it to the typed handler below.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* RegisterModel(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListObjects(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DropModel(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListHandles(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

 private:
  struct Tiers {
    Catalog& catalog;
    HostCache& host_cache;
    GpuTier& gpu_tier;
    std::vector<NamedGpuTier> client_groups;
    SessionOptions session_options;
    UnreadAnswerBudget& unread_answers;
    NodeParts node;
  };

  // The tiers to serve a call on. UNAVAILABLE while starting, and once shutting down unless
  // `during_shutdown` (calls that only read).
  absl::StatusOr<Tiers*> Serving(bool during_shutdown = false) const;
  // Counts `status` and converts it for gRPC.
  grpc::Status Answer(const absl::Status& status) const;
  // Serves a raw unary call with `handle`, a typed handler below.
  template <typename Request, typename Response>
  grpc::ServerUnaryReactor* Serve(const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                  void (TierdService::*handle)(UnaryCall<Request, Response>&));

  // The typed handlers of the unary calls; each answers its call once.
  void HandleListModels(UnaryCall<v1::ListModelsRequest, v1::ListModelsResponse>& call);
  void HandleListObjects(UnaryCall<v1::ListObjectsRequest, v1::ListObjectsResponse>& call);
  void HandleDropModel(UnaryCall<v1::DropModelRequest, v1::DropModelResponse>& call);
  void HandlePrefetch(UnaryCall<v1::PrefetchRequest, v1::PrefetchResponse>& call);
  void HandleEvict(UnaryCall<v1::EvictRequest, v1::EvictResponse>& call);
  void HandleGetStats(UnaryCall<v1::GetStatsRequest, v1::Stats>& call);
  void HandleListHandles(UnaryCall<v1::ListHandlesRequest, v1::ListHandlesResponse>& call);

  ResponseCounters* const counters_;
  std::unique_ptr<Tiers> attached_;  // set once by Attach, before tiers_ publishes it
  std::atomic<Tiers*> tiers_{nullptr};
  std::atomic<bool> shutting_down_{false};
  RegistrationQueue registrations_;
  TimerThread admin_;  // last: joined first (drops)
};

}  // namespace tierd

#endif  // TIERD_SERVER_TIERD_SERVICE_H_
