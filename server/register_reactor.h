// The RegisterModel call: registers a model on a registration worker (server/registration_queue.h),
// writing one progress message per file. The worker may block on a write (never a gRPC thread);
// a client that goes away (its deadline passes, it is killed, it cancels) stops the registration
// where it is — waiting for memory, reading headers, or just before it would be committed — and
// nothing is registered.
//
// Owns itself: deleted by gRPC once the call is done.
#ifndef TIERD_SERVER_REGISTER_REACTOR_H_
#define TIERD_SERVER_REGISTER_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/registration_queue.h"
#include "storage/model/catalog.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

class RegisterReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // Queues the registration `raw` (a serialized RegisterModelRequest) asks for on `queue`, where
  // it was admitted (it Leaves the queue when done), as remote when `remote`. The request is
  // parsed on the worker, once the registration's memory is held: while it waits it holds only
  // its bytes. `registered` runs once the model is registered, before the answer; `answer`
  // converts the outcome for the call.
  RegisterReactor(Catalog& catalog, RegistrationQueue& queue, const grpc::ByteBuffer& raw,
                  bool remote, std::function<void(const std::string& name)> registered,
                  std::function<grpc::Status(const absl::Status&)> answer);

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override { delete this; }

 private:
  void Run();
  // Registers, or says why not: everything the client sent is checked before any of it reaches
  // the log, and is quoted there and in errors.
  absl::StatusOr<ModelSummary> Register();
  // The request's own checks, before anything is logged or read.
  absl::Status Check() const;
  // Writes `message` and waits until the write is done (or the client is gone).
  void Write(const v1::RegisterModelProgress& message) ABSL_LOCKS_EXCLUDED(mu_);
  // Leaves the queue and answers `status`; the last thing Run does.
  void Answer(const absl::Status& status);

  Catalog& catalog_;
  RegistrationQueue& queue_;
  grpc::ByteBuffer raw_;  // until parsed into request_
  const uint64_t request_bytes_;
  const bool remote_;
  v1::RegisterModelRequest request_;
  const std::function<void(const std::string& name)> registered_;
  const std::function<grpc::Status(const absl::Status&)> answer_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  grpc::ByteBuffer message_;  // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tierd

#endif  // TIERD_SERVER_REGISTER_REACTOR_H_
