#include "server/session_reactor.h"

#include <utility>

namespace tierd {

SessionReactor::SessionReactor(GpuTier& tier, const SessionOptions& options)
    : outbox_(std::make_shared<Outbox>()) {
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
    reactor->in_flight_ = std::move(response);
  }
  reactor->StartWrite(&reactor->in_flight_);
}

void SessionReactor::OnWriteDone(bool ok) {
  bool more = false;
  {
    absl::MutexLock lock(&outbox_->mu);
    if (!ok) {
      outbox_->write_failed = true;  // the client is gone; its reads fail too
      outbox_->queue.clear();
    }
    if (!outbox_->queue.empty()) {
      in_flight_ = std::move(outbox_->queue.front());
      outbox_->queue.pop_front();
      more = true;
    } else {
      outbox_->writing = false;
    }
  }
  if (more) {
    StartWrite(&in_flight_);
  } else {
    MaybeFinish();
  }
}

void SessionReactor::OnReadDone(bool ok) {
  if (ok) {
    protocol_->Handle(request_);
    StartRead(&request_);
    return;
  }
  // Half-close, cancellation or a broken connection: the session is over.
  protocol_->Close();
  {
    absl::MutexLock lock(&outbox_->mu);
    outbox_->reads_done = true;
  }
  MaybeFinish();
}

void SessionReactor::MaybeFinish() {
  {
    absl::MutexLock lock(&outbox_->mu);
    if (!outbox_->reads_done || outbox_->writing || outbox_->finish_called) return;
    outbox_->finish_called = true;
  }
  Finish(grpc::Status::OK);
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
