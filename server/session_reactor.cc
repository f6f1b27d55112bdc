#include "server/session_reactor.h"

#include <optional>
#include <utility>

#include "common/deferred_calls.h"
#include "common/log.h"
#include "server/proto_convert.h"
#include "server/raw_call.h"

namespace tierd {

SessionReactor::SessionReactor(grpc::CallbackServerContext* context, GpuTier& tier,
                               const SessionOptions& options, UnreadAnswerBudget& unread_answers)
    : outbox_(std::make_shared<Outbox>(context, unread_answers)), counters_(options.counters) {
  {
    absl::MutexLock lock(&outbox_->mu);
    outbox_->reactor = this;
    // Cut by another session's charge when this one holds the most unread answers.
    outbox_->unread.OnCut([weak = std::weak_ptr<Outbox>(outbox_)] {
      if (std::shared_ptr<Outbox> outbox = weak.lock()) Cut(outbox);
    });
  }
  protocol_ = std::make_shared<SessionProtocol>(
      tier, options,
      [outbox = outbox_](v1::SessionResponse response) { Send(outbox, std::move(response)); });
  StartRead(&request_);
}

void SessionReactor::Outbox::DropQueueLocked() {
  uint64_t dropped = 0;
  for (const Queued& queued : queue) dropped += queued.bytes;
  std::deque<Queued>().swap(queue);
  unread.Release(dropped);
  ReturnMemoryAfterDropping(dropped);
}

void SessionReactor::Send(const std::shared_ptr<Outbox>& outbox, v1::SessionResponse response) {
  SessionReactor* reactor = nullptr;
  bool cut_this = false;
  {
    DeferredCalls cuts;  // of other sessions, holding more, after this one's lock
    absl::MutexLock lock(&outbox->mu);
    if (outbox->reactor == nullptr || outbox->finish_called || outbox->write_failed) return;
    if (outbox->writing) {
      const uint64_t bytes = response.ByteSizeLong();
      absl::Status charged = outbox->unread.Charge(bytes, cuts.calls());
      if (charged.ok()) {
        outbox->queue.push_back({std::move(response), bytes});
        return;
      }
      // The client does not read what it asked for. At most a line per 10 s: a client may cause
      // many.
      TIERD_LOG_EVERY_N_SEC(WARNING, 10)
          << "session stream: " << charged.message() << "; cancelling it";
      cut_this = true;
    } else {
      // While `writing` is set Finish is not called, so the reactor stays alive past the unlock.
      outbox->writing = true;
      reactor = outbox->reactor;
    }
  }
  if (cut_this) return Cut(outbox);
  reactor->StartWriting(response);
}

void SessionReactor::Cut(const std::shared_ptr<Outbox>& outbox) {
  grpc::CallbackServerContext* context;
  {
    absl::MutexLock lock(&outbox->mu);
    if (outbox->reactor == nullptr || outbox->finish_called || outbox->write_failed) return;
    outbox->write_failed = true;
    outbox->DropQueueLocked();
    outbox->cancelling = true;
    context = outbox->context;
  }
  // Only cancelling brings back the write the client does not take. gRPC runs OnCancel, which
  // closes the session, on its executor, never inside TryCancel: this may be called under the
  // protocol's lock.
  context->TryCancel();
  {
    absl::MutexLock lock(&outbox->mu);
    outbox->cancelling = false;
  }
  MaybeFinish(outbox);
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
      outbox_->DropQueueLocked();
    }
    if (!outbox_->queue.empty()) {
      Outbox::Queued& queued = outbox_->queue.front();
      outbox_->unread.Release(queued.bytes);
      next = std::move(queued.response);
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
        outbox->cancelling || outbox->finish_called) {
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
