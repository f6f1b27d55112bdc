// The tierd.v1.Tierd service: the Session stream (SessionReactor) and the unary calls people and
// scripts make. Handlers never block on I/O: registration and dropping models run on the service's
// admin thread; everything else is in-memory bookkeeping or hands work to the tiers.
#ifndef TIERD_SERVER_TIERD_SERVICE_H_
#define TIERD_SERVER_TIERD_SERVICE_H_

#include <atomic>

#include "common/timer_thread.h"
#include "server/gpu_tier.h"
#include "server/session.h"
#include "storage/catalog.h"
#include "storage/host_cache.h"
#include "tierd/v1/tierd.grpc.pb.h"

namespace tierd {

class TierdService final : public v1::Tierd::CallbackService {
 public:
  // All references must outlive the service.
  TierdService(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
               SessionOptions session_options);
  // Waits for registrations in progress.
  ~TierdService() override;

  // From now on new sessions and calls are refused with UNAVAILABLE.
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
  grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                   const absl::Status& status);
  absl::Status CheckServing() const;

  Catalog& catalog_;
  HostCache& host_cache_;
  GpuTier& gpu_tier_;
  const SessionOptions session_options_;
  std::atomic<bool> shutting_down_{false};
  TimerThread admin_;  // last: joined first
};

}  // namespace tierd

#endif  // TIERD_SERVER_TIERD_SERVICE_H_
