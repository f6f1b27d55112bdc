// Serves sessions on the session socket (wire/session_socket.h): the Session stream's protocol
// without gRPC, for the latency of the data path.
//
// An acceptor thread hands each connection to the SessionSocketWorker serving the fewest; a few
// workers (SessionSocketOptions::threads) serve every connection, each in an epoll loop
// (server/session_socket_worker.h), so sixteen clients cost sixteen sockets, not sixteen threads
// to wake. Limits: at most kMaxConnections connections; a client must greet within
// kGreetingTimeout, and finish a frame it has begun within kFrameTimeout (a connection idle between
// frames may stay). Answers a client has not read are charged to the daemon's UnreadAnswerBudget:
// one whose queue would pass the budget's per-connection limit, or take the daemon's total past the
// budget, is disconnected, and its queue freed at once. A disconnected session ends and what it
// held is released.
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
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/gpu_tier.h"
#include "server/session_protocol.h"
#include "server/session_socket_worker.h"
#include "server/unread_answer_budget.h"

namespace tierd {

struct SessionSocketOptions {
  // Threads serving the connections (--session-threads), each any number of them.
  int threads = 1;
  // How long a thread that has just served something polls for more before it sleeps
  // (--session-busy-poll-us; SessionSocketWorker).
  absl::Duration busy_poll = absl::ZeroDuration();
};

// The default of --session-threads: a quarter of the CPUs this process may run on, from 1 to 4.
int DefaultSessionThreads();

class SessionSocketServer {
 public:
  static constexpr int kMaxConnections = 1024;
  static constexpr absl::Duration kGreetingTimeout = absl::Seconds(5);
  // Once a frame has begun (its first byte has arrived), the rest must arrive within this; a
  // connection idle between frames has no limit.
  static constexpr absl::Duration kFrameTimeout = absl::Seconds(5);
  // Binds `path` (replacing a stale socket; refusing one a live server answers on), makes it
  // mode 0660 with `group` (unless nullopt), starts `serving.threads` workers and starts
  // accepting. Each connection charges the answers its client has not read to `unread_answers`.
  // `tier` and `unread_answers` must outlive the server. REQUIRES: serving.threads >= 1.
  static absl::StatusOr<std::unique_ptr<SessionSocketServer>> Start(
      const std::string& path, std::optional<gid_t> group, GpuTier& tier, SessionOptions options,
      SessionSocketOptions serving, UnreadAnswerBudget& unread_answers);
  // Shutdown(now), then joins every thread.
  ~SessionSocketServer();
  SessionSocketServer(const SessionSocketServer&) = delete;
  SessionSocketServer& operator=(const SessionSocketServer&) = delete;

  // Refuses new connections and removes the socket file; sessions already open go on.
  void StopAccepting() ABSL_LOCKS_EXCLUDED(mu_, shutdown_mu_);
  // StopAccepting(), lets open sessions run until their clients end them or `deadline` passes,
  // then ends the rest (what they hold is released) and joins the workers. Callers are
  // serialized; later calls find nothing left to do.
  void Shutdown(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_, shutdown_mu_);

 private:
  SessionSocketServer(std::string path, int listen_fd);
  void StopAcceptingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shutdown_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // The worker serving the fewest connections.
  SessionSocketWorker& LeastBusyWorker() const;
  void OnConnectionEnd() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;
  const int listen_fd_;
  std::vector<std::unique_ptr<SessionSocketWorker>> workers_;  // set by Start
  absl::Mutex shutdown_mu_;  // held through StopAccepting and Shutdown; taken before mu_
  bool accepting_ ABSL_GUARDED_BY(shutdown_mu_) = true;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // the acceptor is to stop
  int active_ ABSL_GUARDED_BY(mu_) = 0;         // connections accepted and not ended
  std::thread acceptor_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_SESSION_SOCKET_SERVER_H_
