// The request/answer core of a session, on the client's side of the wire: the transport, the
// matching of responses to requests by id, and the handles the daemon sent, opened in this
// process. The C++ client's Session is built on it, and so is a daemon asking its peers for
// objects (server/node/peer_daemons.h).
//
// One thread at a time reads the transport (holds the reader's role) and hands each answer to
// whoever waits for it. A caller waiting for its answer takes the role when nobody holds it and
// reads until its answer comes, so a call costs one wake-up, not two (the answer wakes the caller,
// not a thread that then wakes the caller). The core's reader thread takes the role when no
// caller holds it or waits, and answers are owed to callbacks, the session is closing, or nothing
// has been read for kIdleWatch — so that a quiet request's failure is logged and the end of the
// stream is seen while the callers do other work — and keeps it until a caller waits or it has
// answered a call. So the first call after a pause of kIdleWatch is handed over; the next ones,
// made while the session is busy, read for themselves.
//
// Thread-safe: requests from several threads are pipelined on the one transport.
#ifndef TIERD_WIRE_SESSION_CORE_H_
#define TIERD_WIRE_SESSION_CORE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "device/device.h"
#include "device/shared_memory.h"
#include "tierd/v1/tierd.grpc.pb.h"
#include "wire/done_events.h"
#include "wire/session_transport.h"

namespace tierd {
class PeerArena;
namespace detail {
class OpenedHandles;
}  // namespace detail

// The status a session response carries (its code and message).
absl::Status StatusOf(const v1::SessionResponse& response);

class SessionCore {
 public:
  // How long the transport may go unread, while no caller reads it, before the reader thread does.
  static constexpr absl::Duration kIdleWatch = absl::Milliseconds(50);
  // How long destroying the session waits for the daemon to end it (the answers still on their
  // way, then the end of the stream) before it cuts the connection: a daemon that hangs must not
  // hang its client.
  static constexpr absl::Duration kCloseGrace = absl::Seconds(2);

  // Starts the reader thread on `transport`. The caller sends the session's `open` request first.
  static std::shared_ptr<SessionCore> Start(std::unique_ptr<SessionTransport> transport);
  // Close(), unless it was called.
  ~SessionCore();
  SessionCore(const SessionCore&) = delete;
  SessionCore& operator=(const SessionCore&) = delete;

  // Ends the stream (the daemon releases what the session holds) and joins the reader, on this
  // thread: an owner calls it where the last reference may be dropped on the reader thread (by a
  // handler of an answer), which cannot join itself. Every call fails afterwards; a second Close
  // does nothing. REQUIRES: not on the reader thread (from a `done`), not concurrently with
  // another Close.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // Sends `request` (its request_id is assigned here) and waits for its response; a response with
  // an error code becomes that error. UNAVAILABLE once the stream has ended.
  absl::StatusOr<v1::SessionResponse> Call(v1::SessionRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `request` without waiting. The response, when it comes, goes to `done` on the thread
  // that reads it (a caller's or the reader thread: `done` must not block), or is only logged when
  // it is an error and `done` is null.
  absl::Status Send(v1::SessionRequest request,
                    std::function<void(const v1::SessionResponse&)> done = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sends a request the daemon answers only when it fails (a quiet release); the reader logs such
  // a failure (within about kIdleWatch, or with the next call's answer).
  absl::Status SendQuiet(v1::SessionRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  // One round trip for many requests: sends `quiet` (as SendQuiet would) and then `calls`, all in
  // one write of the transport, and waits for the calls' answers. Returns one per call, in order,
  // each as Call would; the session's ended status (UNAVAILABLE) for every call once it is over.
  std::vector<absl::StatusOr<v1::SessionResponse>> CallMany(std::vector<v1::SessionRequest> quiet,
                                                            std::vector<v1::SessionRequest> calls)
      ABSL_LOCKS_EXCLUDED(mu_);

  const char* transport_kind() const { return transport_->kind(); }
  // True once the stream has ended (the daemon went away or closed it); every call then fails.
  bool ended() ABSL_LOCKS_EXCLUDED(mu_);
  // Why the stream ended (SessionTransport::Finish): OK while it has not, and when it ended
  // cleanly. The calls that fail because it ended say "the session with tierd has ended: " and
  // this reason.
  absl::Status end_reason() ABSL_LOCKS_EXCLUDED(mu_);
  void set_device(std::shared_ptr<Device> device) { device_ = std::move(device); }
  Device& device() { return *device_; }
  // After set_device: checks the daemon speaks this session protocol (FAILED_PRECONDITION), opens
  // the handles of the session's `open` answer, which the reader could not (the device was not
  // known yet), and takes the session's done events from it.
  absl::Status Opened(const v1::SessionResponse& open_answer);
  // Opens the handles `response` brings that this session has not opened yet.
  absl::Status OpenHandles(const v1::SessionResponse& response);
  absl::StatusOr<Slab*> slab(uint32_t id);
  absl::StatusOr<Event*> event(uint32_t id);
  // A host handoff buffer (Handle.HOST_BUFFER), mapped and registered with device(); only
  // daemons asking each other for objects through the host are sent one.
  absl::StatusOr<const SharedMemory*> host_buffer(uint32_t id);
  // A home daemon's host arena (Handle.HOST_ARENA), mapped read-only and registered with
  // device() as its pieces are used (wire/peer_arena.h); only daemons asking each other
  // for host leases are sent one.
  absl::StatusOr<PeerArena*> host_arena(uint32_t id);

  // Releases a lease: records a done event on `stream` after the work enqueued there (DoneEvents),
  // then tells the daemon, without waiting for its answer. Once the session has ended it does
  // nothing: the daemon released the lease, and the session's events may be another's by now.
  void ReleaseLease(uint64_t lease_id, Stream& stream);
  // The quiet releases ReleaseLease would send for `lease_ids`, for the caller to send
  // (CallMany): one done event, recorded on `stream`, names the end of every one's reads. None
  // when nothing is to be sent: the session has ended, or nothing says when `stream` is done with
  // the buffers (the leases then stay held until the session ends).
  std::vector<v1::SessionRequest> PrepareReleases(const std::vector<uint64_t>& lease_ids,
                                                  Stream& stream);
  // Records a done event after the work enqueued on `stream` (DoneEvents::RecordAfter): its id,
  // to name in a commit, nullopt when none is needed, or the device's error when nothing says the
  // stream is done. `what` and `id` name it in the message of a failure ("reservation", 7).
  absl::StatusOr<std::optional<uint32_t>> RecordDone(Stream& stream, const char* what, uint64_t id);

 private:
  struct Pending;
  SessionCore();
  // The reader thread: takes the reader's role as the class comment says, until the stream ends.
  void ReaderThread() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether answers are owed that only the reader thread would read (no caller waits for them).
  bool ReaderThreadWantedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the transport as the role's holder (reading_, set by the caller) until `mine` is
  // answered or, for the reader thread (`mine` null), until a caller waits or one of the answers
  // read was a call's; or until the stream ends. Then gives the role up. Unlocks mu_ around reads.
  void ReadWhileReader(const Pending* mine) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `pending` is answered, reading for it while nobody else reads.
  void AwaitAnswerLocked(const Pending& pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands `response` to whoever waits for it (opening the handles it brings first). True when it
  // answered a Call.
  bool Dispatch(v1::SessionResponse& response) ABSL_LOCKS_EXCLUDED(mu_);
  // After the last Read: learns why the stream ended, and answers every request still pending.
  void EndStream() ABSL_LOCKS_EXCLUDED(mu_);
  // UNAVAILABLE "the session with tierd has ended", with end_reason_ when there is one.
  absl::Status EndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failed write: the stream is over, and the reader is about to learn why; waits a short
  // while for it (unless called by the reader itself, from a callback), so that the error carries
  // the reason.
  absl::Status EndedAfterFailedWrite() ABSL_LOCKS_EXCLUDED(mu_);
  // What became of a request Submit wrote.
  enum class Submitted {
    kWritten,
    kFailedUnanswered,  // the write failed and nobody answered the request: the caller must
    kFailedAnswered,    // the write failed, and the reader already answered it as an orphan
  };
  // Gives `request` the next id, registers `pending` (when not null) under it, and writes it.
  // The ended session's status when the session is over already.
  absl::StatusOr<Submitted> Submit(v1::SessionRequest& request, std::shared_ptr<Pending> pending)
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_);
  // Submit for many requests, written at once (SessionTransport::WriteMany): pendings[i] (null for
  // a quiet request) belongs to requests[i]; what became of each is put in `submitted`.
  absl::Status SubmitAll(absl::Span<v1::SessionRequest> requests,
                         absl::Span<const std::shared_ptr<Pending>> pendings,
                         std::vector<Submitted>& submitted) ABSL_LOCKS_EXCLUDED(mu_, write_mu_);

  std::shared_ptr<Device> device_;
  std::unique_ptr<SessionTransport> transport_;
  absl::Mutex write_mu_;  // one Write at a time; taken before mu_ is never needed
  absl::Mutex mu_;
  uint64_t next_request_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a thread holds the reader's role
  absl::Time role_free_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int callers_waiting_ ABSL_GUARDED_BY(mu_) = 0;  // for an answer, while another thread reads
  int callbacks_owed_ ABSL_GUARDED_BY(mu_) = 0;   // pending requests sent with Send
  bool closing_ ABSL_GUARDED_BY(mu_) = false;     // the destructor waits for the end
  bool end_wanted_ ABSL_GUARDED_BY(mu_) = false;  // a write failed: read on to the end
  absl::Status end_reason_ ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<detail::OpenedHandles> handles_;
  std::unique_ptr<DoneEvents> done_events_;  // set by Opened, before any release or commit
  std::thread reader_;
};

}  // namespace tierd

#endif  // TIERD_WIRE_SESSION_CORE_H_
