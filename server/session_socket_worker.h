// One of the threads that serve the session socket's connections (server/session_socket_server.h):
// an epoll loop over the connections it was given, any number of them. It reads what each client
// sent without blocking, takes the frames apart (wire/frame_decoder.h) and hands each request to
// the connection's SessionProtocol, in order. SessionProtocol::Handle never blocks, so one slow
// client holds up no other.
//
// Answers are sent at once, on whichever thread produced them, when the socket takes them without
// blocking; otherwise they are queued and this thread sends them when the client has read enough.
// What is queued is charged to the daemon's UnreadAnswerBudget: a connection whose queue would pass
// the budget's per-connection limit, or take the daemon past the budget, is cut (its queue freed at
// once), and its session ends.
//
// With `busy_poll`, a worker that has just served something polls its connections without sleeping
// for up to that long before it waits in epoll_wait(): a request that comes meanwhile wakes no
// thread (on a virtual machine a wake-up crosses the hypervisor), at the price of that much CPU
// once the requests stop.
//
// Thread-safe.
#ifndef TIERD_SERVER_SESSION_SOCKET_WORKER_H_
#define TIERD_SERVER_SESSION_SOCKET_WORKER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/gpu_tier.h"
#include "server/session_protocol.h"
#include "server/unread_answer_budget.h"

namespace tierd {

class SessionSocketWorker {
 public:
  struct Limits {
    // A new connection must greet within this.
    absl::Duration greeting_timeout;
    // Once a frame has begun (its first byte has arrived), the rest must arrive within this; a
    // connection idle between frames has no limit.
    absl::Duration frame_timeout;
  };

  // Starts the worker's thread. `on_connection_end` is called with no lock held, once for each
  // connection after its session has ended and its socket is closed: on the worker's thread, or
  // on Add()'s for a connection added after Stop(). `tier` and `unread_answers` must outlive the
  // worker.
  static absl::StatusOr<std::unique_ptr<SessionSocketWorker>> Start(
      GpuTier& tier, SessionOptions options, absl::Duration busy_poll, Limits limits,
      UnreadAnswerBudget& unread_answers, std::function<void()> on_connection_end);
  // Stop().
  ~SessionSocketWorker();
  SessionSocketWorker(const SessionSocketWorker&) = delete;
  SessionSocketWorker& operator=(const SessionSocketWorker&) = delete;

  // Serves `fd`, a connection just accepted, from its greeting until its client ends it or Stop():
  // the worker owns it from now on. After Stop() it is closed at once (and `on_connection_end`
  // called for it).
  void Add(int fd) ABSL_LOCKS_EXCLUDED(mu_);
  // Connections added and not ended yet.
  int connections() const { return connections_.load(std::memory_order_relaxed); }
  // Ends every connection (what their sessions hold is released) and joins the thread.
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Connection;
  SessionSocketWorker(int epoll_fd, int wake_fd, GpuTier& tier, SessionOptions options,
                      absl::Duration busy_poll, Limits limits, UnreadAnswerBudget& unread_answers,
                      std::function<void()> on_connection_end);

  void Loop();
  // Takes the connections Add() queued. Returns false once Stop() was called.
  bool TakeAdded() ABSL_LOCKS_EXCLUDED(mu_);
  void Open(int fd);
  // What epoll reported for `connection`.
  void OnEvents(const std::shared_ptr<Connection>& connection, uint32_t events);
  // Reads what the client sent (a bounded amount, so that one busy client does not starve the
  // rest) and handles it. Returns false when the connection is to end at once.
  bool ReadRequests(const std::shared_ptr<Connection>& connection);
  // Hands the frames in `bytes` to the connection's greeting or its protocol; false as above.
  bool Take(const std::shared_ptr<Connection>& connection, absl::string_view bytes);
  // The client half-closed: the answers to its requests in flight still go out, then the session
  // ends and the connection with it.
  void OnHalfClose(const std::shared_ptr<Connection>& connection);
  // Ends the session and closes the socket.
  void End(const std::shared_ptr<Connection>& connection);
  // Ends connections whose greeting or frame is overdue; returns the next such deadline.
  absl::Time EndOverdue(absl::Time now);

  // Answers from any thread: sent at once if the socket takes them, else queued.
  static void Enqueue(const std::shared_ptr<Connection>& connection, std::string frame);

  const int epoll_fd_;
  const int wake_fd_;  // an eventfd: Add() and Stop() wake the loop through it
  GpuTier& tier_;
  const SessionOptions options_;
  const absl::Duration busy_poll_;
  const Limits limits_;
  UnreadAnswerBudget& unread_answers_;
  const std::function<void()> on_connection_end_;
  std::atomic<int> connections_{0};

  absl::Mutex mu_;
  std::vector<int> added_ ABSL_GUARDED_BY(mu_);  // accepted, for the loop to open
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // The loop's own: every open connection, by its address (epoll's data.ptr), and the earliest
  // greeting or frame deadline among them.
  absl::flat_hash_map<Connection*, std::shared_ptr<Connection>> open_;
  absl::Time next_deadline_ = absl::InfiniteFuture();
  std::vector<char> read_buffer_;
  v1::SessionRequest request_;  // each request parsed in turn

  absl::Mutex stop_mu_;  // serializes Stop()
  std::thread thread_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_SESSION_SOCKET_WORKER_H_
