// The gRPC side of one Session stream: reads requests into a SessionProtocol and writes its
// responses back in order, one write in flight at a time. Responses produced after the stream is
// gone are dropped.
//
// A client that half-closes (sends its last request, as grpcurl does at the end of its input)
// still gets the answers to the requests in flight; then the session closes, releasing what it
// holds, and the stream ends OK. A request that does not parse is handled alike, but the stream
// ends INVALID_ARGUMENT saying why. A cancelled or broken stream closes the session at once.
#ifndef TIERD_SERVER_SESSION_REACTOR_H_
#define TIERD_SERVER_SESSION_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/session_protocol.h"
#include "server/unread_answer_budget.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

class SessionReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Starts reading at once. Answers waiting to be written are charged to `unread_answers` (which
  // must outlive the stream); a stream whose client lets them pile up past it is cancelled.
  // Deletes itself when the stream is done.
  SessionReactor(grpc::CallbackServerContext* context, GpuTier& tier, const SessionOptions& options,
                 UnreadAnswerBudget& unread_answers);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Outlives the reactor: the protocol's late callbacks send through it.
  struct Outbox {
    Outbox(grpc::CallbackServerContext* context, UnreadAnswerBudget& budget)
        : context(context), unread(budget) {}

    // Frees the queue and its share of the budget: nothing in it will be written.
    void DropQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

    grpc::CallbackServerContext* const context;  // valid while `reactor` is set
    absl::Mutex mu;
    SessionReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    struct Queued {
      v1::SessionResponse response;
      uint64_t bytes;  // charged to `unread`
    };
    std::deque<Queued> queue ABSL_GUARDED_BY(mu);  // answers waiting for the write in flight
    UnreadAnswerBudget::Account unread ABSL_GUARDED_BY(mu);  // the bytes in `queue`
    bool writing ABSL_GUARDED_BY(mu) = false;
    // Nothing more is written: the client is gone, or was cut for not reading.
    bool write_failed ABSL_GUARDED_BY(mu) = false;
    // A cut's TryCancel is under way: Finish waits, so the context stays valid through it.
    bool cancelling ABSL_GUARDED_BY(mu) = false;
    bool reads_done ABSL_GUARDED_BY(mu) = false;  // and the session closed
    bool finish_called ABSL_GUARDED_BY(mu) = false;
    // What the stream ends with: OK, or why a request could not be parsed.
    grpc::Status finish_status ABSL_GUARDED_BY(mu);
  };

  static void Send(const std::shared_ptr<Outbox>& outbox, v1::SessionResponse response);
  // Cuts the stream: its queue is dropped, nothing more is written, and it is cancelled (the
  // session then closes). For a client that does not read; any thread, no lock held.
  static void Cut(const std::shared_ptr<Outbox>& outbox) ABSL_LOCKS_EXCLUDED(outbox->mu);
  // Serializes `response` into in_flight_ and starts writing it.
  void StartWriting(const v1::SessionResponse& response);
  // Reads are over (`why` is OK for a half-close): the session closes once every request in
  // flight is answered, and the stream finishes with `why` once those answers are written.
  void EndReads(const grpc::Status& why);
  // Calls Finish once reads are over and nothing is left to write. Any thread: until Finish the
  // reactor is alive.
  static void MaybeFinish(const std::shared_ptr<Outbox>& outbox) ABSL_LOCKS_EXCLUDED(outbox->mu);

  std::shared_ptr<Outbox> outbox_;
  std::shared_ptr<SessionProtocol> protocol_;
  ResponseCounters* const counters_;  // may be null
  grpc::ByteBuffer request_;          // the request being read, as it came
  grpc::ByteBuffer in_flight_;        // the response being written
};

}  // namespace tierd

#endif  // TIERD_SERVER_SESSION_REACTOR_H_
