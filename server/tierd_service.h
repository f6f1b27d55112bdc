// The tierd.v1.Tierd service: the Session stream (SessionReactor) and the unary calls people and
// scripts make. It is served from the daemon's first moment (answering UNAVAILABLE while the
// daemon starts) and attached to the tiers once they are ready. Handlers never block on I/O:
// registration and dropping models run on the service's admin thread; everything else is
// in-memory bookkeeping or hands work to the tiers.
#ifndef TIERD_SERVER_TIERD_SERVICE_H_
#define TIERD_SERVER_TIERD_SERVICE_H_

#include <atomic>
#include <memory>
#include <vector>

#include "common/timer_thread.h"
#include "server/gpu_tier.h"
#include "server/response_counters.h"
#include "server/session.h"
#include "server/stats.h"
#include "storage/catalog.h"
#include "storage/host_cache.h"
#include "tierd/v1/tierd.grpc.pb.h"

namespace tierd {

class TierdService final : public v1::Tierd::CallbackService {
 public:
  // The service starts out not serving: every call is answered UNAVAILABLE ("tierd is starting")
  // until Attach. Answers are counted in `counters` (must outlive the service; may be null).
  explicit TierdService(ResponseCounters* counters);
  // Waits for registrations in progress.
  ~TierdService() override;

  // Serves calls on these tiers from now on: `gpu_tier` is the default client group's, the one
  // sessions and calls on this service use; `client_groups` are the other groups' tiers, which
  // stats include and dropped models are removed from. The references must outlive the service.
  // Call once.
  void Attach(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
              std::vector<NamedGpuTier> client_groups, SessionOptions session_options);
  // From now on new sessions and calls that change state are refused with UNAVAILABLE; listing
  // and stats still answer.
  void StartShutdown() { shutting_down_ = true; }

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerWriteReactor<v1::RegisterModelProgress>* RegisterModel(
      grpc::CallbackServerContext* context, const v1::RegisterModelRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* ListObjects(grpc::CallbackServerContext* context,
                                        const v1::ListObjectsRequest* request,
                                        v1::ListObjectsResponse* response) override;
  grpc::ServerUnaryReactor* DropModel(grpc::CallbackServerContext* context,
                                      const v1::DropModelRequest* request,
                                      v1::DropModelResponse* response) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* context,
                                     const v1::PrefetchRequest* request,
                                     v1::PrefetchResponse* response) override;
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* context,
                                  const v1::EvictRequest* request,
                                  v1::EvictResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::Stats* response) override;
  grpc::ServerUnaryReactor* ListHandles(grpc::CallbackServerContext* context,
                                        const v1::ListHandlesRequest* request,
                                        v1::ListHandlesResponse* response) override;

 private:
  struct Tiers {
    Catalog& catalog;
    HostCache& host_cache;
    GpuTier& gpu_tier;
    std::vector<NamedGpuTier> client_groups;
    SessionOptions session_options;
  };

  // The tiers to serve a call on. UNAVAILABLE while starting, and once shutting down unless
  // `during_shutdown` (calls that only read).
  absl::StatusOr<Tiers*> Serving(bool during_shutdown = false) const;
  // Counts `status` and converts it for gRPC.
  grpc::Status Answer(const absl::Status& status) const;
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                   const absl::Status& status);

  ResponseCounters* const counters_;
  std::unique_ptr<Tiers> attached_;  // set once by Attach, before tiers_ publishes it
  std::atomic<Tiers*> tiers_{nullptr};
  std::atomic<bool> shutting_down_{false};
  TimerThread admin_;  // last: joined first
};

}  // namespace tierd

#endif  // TIERD_SERVER_TIERD_SERVICE_H_
