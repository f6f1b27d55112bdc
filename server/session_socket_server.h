// Serves sessions on the session socket (wire/session_socket.h): the Session stream's protocol
// without gRPC, for the latency of the data path.
//
// One reader thread per connection feeds SessionProtocol, in order. Answers are sent at once when
// the socket takes them without blocking, and otherwise queued for the connection's writer thread,
// so SessionProtocol's `send` never blocks. Limits: at most kMaxConnections connections; a client
// must greet within kGreetingTimeout, and finish a frame it has begun within kFrameTimeout (a
// connection idle between frames may stay). Answers a client has not read are charged to the
// daemon's UnreadAnswerBudget: one whose queue would pass the budget's per-connection limit, or
// take the daemon's total past the budget, is disconnected, and its queue freed at once. A
// disconnected session ends and what it held is released.
//
// A client that half-closes (shutdown(SHUT_WR)) still gets the answers to its requests in flight;
// then its session ends and the connection is closed. One that hangs up altogether meanwhile has
// its session ended at once.
//
// Thread-safe.
#ifndef TIERD_SERVER_SESSION_SOCKET_SERVER_H_
#define TIERD_SERVER_SESSION_SOCKET_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/gpu_tier.h"
#include "server/session.h"
#include "server/unread_answer_budget.h"

namespace tierd {

class SessionSocketServer {
 public:
  static constexpr int kMaxConnections = 1024;
  static constexpr absl::Duration kGreetingTimeout = absl::Seconds(5);
  // Once a frame has begun (its first byte has arrived), the rest must arrive within this; a
  // connection idle between frames has no limit.
  static constexpr absl::Duration kFrameTimeout = absl::Seconds(5);
  // How soon a client that half-closed, then hung up, has its session ended while answers it
  // waits for are still in flight.
  static constexpr absl::Duration kHangUpCheckPeriod = absl::Milliseconds(50);

  // Binds `path` (replacing a stale socket; refusing one a live server answers on), makes it
  // mode 0660 with `group` (unless nullopt) and starts accepting. Each connection charges the
  // answers its client has not read to `unread_answers`. `tier` and `unread_answers` must outlive
  // the server.
  static absl::StatusOr<std::unique_ptr<SessionSocketServer>> Start(
      const std::string& path, std::optional<gid_t> group, GpuTier& tier, SessionOptions options,
      UnreadAnswerBudget& unread_answers);
  // Shutdown(now), then joins every thread.
  ~SessionSocketServer();
  SessionSocketServer(const SessionSocketServer&) = delete;
  SessionSocketServer& operator=(const SessionSocketServer&) = delete;

  // Refuses new connections and removes the socket file; sessions already open go on.
  void StopAccepting() ABSL_LOCKS_EXCLUDED(mu_, shutdown_mu_);
  // StopAccepting(), lets open sessions run until their clients end them or `deadline` passes,
  // then ends the rest (what they hold is released) and joins their threads. Callers are
  // serialized; later calls find nothing left to do.
  void Shutdown(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_, shutdown_mu_);

 private:
  struct Connection;
  SessionSocketServer(std::string path, int listen_fd, GpuTier& tier, SessionOptions options,
                      UnreadAnswerBudget& unread_answers);
  void StopAcceptingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shutdown_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Serve(const std::shared_ptr<Connection>& connection) ABSL_LOCKS_EXCLUDED(mu_);
  // After a half-close: returns once every answer is queued (reads_done) or the connection is
  // shut down, or the client has hung up altogether (checked every kHangUpCheckPeriod).
  static void WaitForAnswersUnlessHungUp(Connection& connection, int fd);
  static void Enqueue(const std::shared_ptr<Connection>& connection, std::string frame);
  static void WriteLoop(const std::shared_ptr<Connection>& connection);
  // Joins and forgets connections whose readers are done.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int listen_fd_;
  GpuTier& tier_;
  const SessionOptions options_;
  UnreadAnswerBudget& unread_answers_;
  absl::Mutex shutdown_mu_;  // held through StopAccepting and Shutdown; taken before mu_
  bool accepting_ ABSL_GUARDED_BY(shutdown_mu_) = true;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // the acceptor is to stop
  std::list<std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // connections whose reader still runs
  std::thread acceptor_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_SESSION_SOCKET_SERVER_H_
