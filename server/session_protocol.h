// One client session's protocol: turns SessionRequests into GpuTier calls and their answers into
// SessionResponses, checking every field first. Knows nothing of gRPC (the reactor feeds it), so
// it can be driven directly by tests and fuzzers.
//
// The first request must be `open`. Each response carries the slab and event handles the session
// has not been sent yet. Responses are produced on whichever thread completes the work, through
// `send`, which must be thread-safe and must not block.
//
// Thread-safe.
#ifndef TIERD_SERVER_SESSION_PROTOCOL_H_
#define TIERD_SERVER_SESSION_PROTOCOL_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/gpu_tier.h"
#include "server/node/host_lender.h"
#include "server/response_counters.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

struct SessionOptions {
  ClientLimits limits;
  std::string backend;  // "host" or "cuda"
  std::string device;   // Device::Describe()
  int device_ordinal = 0;
  uint32_t max_key_bytes = 1024;
  uint32_t max_tensors = 65536;  // per stored object
  // Requests of one session received and not yet answered (fetches waiting for the disk or for
  // room, commits waiting for their copy); one more is refused with RESOURCE_EXHAUSTED at once.
  uint32_t max_requests_in_flight = 1024;
  // Where answers are counted by code; null: not counted. Must outlive the sessions.
  ResponseCounters* counters = nullptr;
  // Lends model objects in the daemon's host arena to the node's other daemons
  // (FetchRequest.host_lease), on the session socket only; null where sessions may not have them
  // (a client group's, or a daemon without peers): they are refused with PERMISSION_DENIED.
  // Each session may hold limits.max_staging_bytes of them. Must outlive the sessions.
  HostLender* host_lender = nullptr;
};

// Checks an object key from a request: non-empty, at most `max_key_bytes`, "NAMESPACE/NAME".
// INVALID_ARGUMENT naming `field` otherwise.
absl::Status CheckKey(const std::string& key, uint32_t max_key_bytes, absl::string_view field);

// Prefetch and Evict as both the session and the unary calls serve them: the request is checked
// (errors name fields under `field`, e.g. "prefetch") and run on `tier`.
absl::StatusOr<v1::PrefetchResponse> RunPrefetch(GpuTier& tier, const v1::PrefetchRequest& request,
                                                 uint32_t max_key_bytes, absl::string_view field);
absl::StatusOr<v1::EvictResponse> RunEvict(GpuTier& tier, const v1::EvictRequest& request,
                                           uint32_t max_key_bytes, absl::string_view field);

class SessionProtocol : public std::enable_shared_from_this<SessionProtocol> {
 public:
  using Send = std::function<void(v1::SessionResponse)>;

  // `peer_pid`: the client's process, where the transport knows it (the session socket's peer
  // credentials); host leases are lent only then.
  SessionProtocol(GpuTier& tier, SessionOptions options, Send send,
                  std::optional<pid_t> peer_pid = std::nullopt);
  // REQUIRES: Close() was called.
  ~SessionProtocol();
  SessionProtocol(const SessionProtocol&) = delete;
  SessionProtocol& operator=(const SessionProtocol&) = delete;

  // Handles one request; never blocks. Every request gets exactly one response (unless the
  // session is closed first).
  void Handle(const v1::SessionRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the session: what it holds is released (GpuTier::CloseClient). Later requests are
  // answered UNAVAILABLE. Idempotent. Runs the callback CloseWhenAnswered left, if any.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  // What a transport does when its client has sent its last request (a half-close) but still
  // reads: later requests are answered UNAVAILABLE, and once every request in flight has been
  // answered — its answer handed to `send` and `send` returned — the session is closed as by
  // Close() and `on_closed` is called. That happens on the thread that handed over the last
  // answer, or on this one when nothing is in flight. A Close() before then (the client cancelled
  // or went away) closes at once and calls `on_closed` itself. `on_closed` is called exactly once,
  // with no lock of the protocol held; at once if the session is already closed. Call at most
  // once.
  void CloseWhenAnswered(std::function<void()> on_closed) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Open(uint64_t request_id, const v1::OpenSession& open) ABSL_LOCKS_EXCLUDED(mu_);
  void Fetch(uint64_t request_id, ClientId client, const v1::FetchRequest& fetch);
  // FetchRequest.host_lease: lends the object where it lies in the host arena.
  void LendHost(uint64_t request_id, const v1::FetchRequest& fetch);
  void Prefetch(uint64_t request_id, const v1::PrefetchRequest& prefetch);
  void Reserve(uint64_t request_id, ClientId client, const v1::ReserveRequest& reserve);
  void Commit(uint64_t request_id, ClientId client, const v1::CommitRequest& commit);
  void Pin(uint64_t request_id, ClientId client, const std::string& key);
  void Evict(uint64_t request_id, const v1::EvictRequest& evict);
  // retain, unretain, sleep, wake and list_retained: the tier's retained sets.
  void Retained(uint64_t request_id, const v1::SessionRequest& request);

  void Reply(uint64_t request_id, const absl::Status& status);
  // The request in flight is done; `status` counted. Every request ends here exactly once: through
  // CountAndSend or SendWithHandles, or through EndQuietly when it is answered with nothing (a
  // quiet release).
  void EndRequestLocked(absl::StatusCode code) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndQuietly() ABSL_LOCKS_EXCLUDED(mu_);
  // Counts `response` by its code, ends its request and sends it.
  void CountAndSend(v1::SessionResponse response) ABSL_LOCKS_EXCLUDED(mu_);
  // An answer counted in answers_being_sent_ has been through `send_`.
  void AnswerSent() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether CloseWhenAnswered's wait is over: every request answered and every answer sent.
  bool AllAnsweredLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return close_when_answered_ && !closed_ && requests_in_flight_ == 0 && answers_being_sent_ == 0;
  }
  // Host memory a response may name.
  enum class HostHandle { kNone, kHandoffBuffer, kArena };
  // Adds to `response` the handles it needs that the session has not been sent yet (`slab`, each
  // of `events`, and `host`) and sends it.
  void SendWithHandles(v1::SessionResponse response, std::optional<uint32_t> slab, HostHandle host,
                       const std::vector<uint32_t>& events) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckKey(const std::string& key, absl::string_view field) const {
    return tierd::CheckKey(key, options_.max_key_bytes, field);
  }

  GpuTier& tier_;
  const SessionOptions options_;
  const Send send_;
  // What the node's other daemons were lent (null without options_.host_lender).
  const std::shared_ptr<HostLeases> host_leases_;

  mutable absl::Mutex mu_;
  ClientId client_ ABSL_GUARDED_BY(mu_) = 0;
  std::string client_name_ ABSL_GUARDED_BY(mu_);  // from open, for the logs
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t requests_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Requests ended whose answers are being handed to `send_` outside the lock.
  uint32_t answers_being_sent_ ABSL_GUARDED_BY(mu_) = 0;
  bool close_when_answered_ ABSL_GUARDED_BY(mu_) = false;  // CloseWhenAnswered was called
  std::function<void()> on_closed_ ABSL_GUARDED_BY(mu_);   // its callback, until called
  std::set<uint32_t> slabs_sent_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> events_sent_ ABSL_GUARDED_BY(mu_);
  bool host_buffer_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool arena_sent_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tierd

#endif  // TIERD_SERVER_SESSION_PROTOCOL_H_
