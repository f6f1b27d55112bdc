#include "server/session_reactor.h"

#include <optional>
#include <utility>

#include "server/proto_convert.h"
#include "server/raw_call.h"

namespace tierd {

SessionReactor::SessionReactor(GpuTier& tier, const SessionOptions& options)
    : outbox_(std::make_shared<Outbox>()), counters_(options.counters) {
  {
    absl::MutexLock lock(&outbox_->mu);
    outbox_->reactor = this;
  }
  protocol_ = std::make_shared<SessionProtocol>(
      tier, options,
      [outbox = outbox_](v1::SessionResponse response) { Send(outbox, std::move(response)); });
  StartRead(&request_);
}

void SessionReactor::Send(const std::shared_ptr<Outbox>& outbox, v1::SessionResponse response) {
  SessionReactor* reactor;
  {
    absl::MutexLock lock(&outbox->mu);
    if (outbox->reactor == nullptr || outbox->finish_called || outbox->write_failed) return;
    if (outbox->writing) {
      outbox->queue.push_back(std::move(response));
      return;
    }
    // While `writing` is set Finish is not called, so the reactor stays alive past the unlock.
    outbox->writing = true;
    reactor = outbox->reactor;
  }
  reactor->StartWriting(response);
}

void SessionReactor::StartWriting(const v1::SessionResponse& response) {
  // A SessionResponse is far below protobuf's 2 GiB limit: serializing it does not fail.
  (void)Serialize(response, in_flight_);
  StartWrite(&in_flight_);
}

void SessionReactor::OnWriteDone(bool ok) {
  std::optional<v1::SessionResponse> next;
  {
    absl::MutexLock lock(&outbox_->mu);
    if (!ok) {
      outbox_->write_failed = true;  // the client is gone; its reads fail too
      outbox_->queue.clear();
    }
    if (!outbox_->queue.empty()) {
      next = std::move(outbox_->queue.front());
      outbox_->queue.pop_front();
    } else {
      outbox_->writing = false;
    }
  }
  if (next.has_value()) {
    StartWriting(*next);
  } else {
    MaybeFinish(outbox_);
  }
}

void SessionReactor::OnReadDone(bool ok) {
  if (!ok) return EndReads(grpc::Status::OK);  // a half-close, or the stream is broken
  v1::SessionRequest request;
  if (absl::Status parsed = ParseRequest(request_, request); !parsed.ok()) {
    // Nothing more is read; what came before is still answered.
    if (counters_ != nullptr) counters_->Count(parsed.code());
    return EndReads(ToGrpcStatus(parsed));
  }
  protocol_->Handle(request);
  StartRead(&request_);
}

void SessionReactor::EndReads(const grpc::Status& why) {
  {
    absl::MutexLock lock(&outbox_->mu);
    outbox_->finish_status = why;
  }
  // A cancelled stream is closed by OnCancel, which makes this call back at once.
  protocol_->CloseWhenAnswered([outbox = outbox_] {
    {
      absl::MutexLock lock(&outbox->mu);
      outbox->reads_done = true;
    }
    MaybeFinish(outbox);
  });
}

void SessionReactor::MaybeFinish(const std::shared_ptr<Outbox>& outbox) {
  SessionReactor* reactor;
  grpc::Status status;
  {
    absl::MutexLock lock(&outbox->mu);
    if (outbox->reactor == nullptr || !outbox->reads_done || outbox->writing ||
        outbox->finish_called) {
      return;
    }
    outbox->finish_called = true;
    reactor = outbox->reactor;
    status = outbox->finish_status;
  }
  // OnDone, which deletes the reactor, comes only after this Finish.
  reactor->Finish(status);
}

void SessionReactor::OnCancel() {
  // The client cancelled or is gone: answers in flight can no longer reach it.
  protocol_->Close();
}

void SessionReactor::OnDone() {
  protocol_->Close();
  {
    absl::MutexLock lock(&outbox_->mu);
    outbox_->reactor = nullptr;
  }
  delete this;
}

}  // namespace tierd
