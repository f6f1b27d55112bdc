// Serves sessions on the session socket (common/session_socket.h): the Session stream's protocol
// without gRPC, for the latency of the data path.
//
// One reader thread per connection feeds SessionProtocol, in order. Answers are sent at once when
// the socket takes them without blocking, and otherwise queued for the connection's writer thread,
// so SessionProtocol's `send` never blocks. A client that stops reading while more than
// kMaxQueuedBytes of answers wait is disconnected (its session ends and what it held is released).
//
// Thread-safe.
#ifndef TIERD_SERVER_SESSION_SOCKET_SERVER_H_
#define TIERD_SERVER_SESSION_SOCKET_SERVER_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/gpu_tier.h"
#include "server/session.h"

namespace tierd {

class SessionSocketServer {
 public:
  static constexpr uint64_t kMaxQueuedBytes = 256ull << 20;

  // Binds `path` (replacing a stale socket; refusing one a live server answers on), makes it
  // mode 0660 and starts accepting. `tier` must outlive the server.
  static absl::StatusOr<std::unique_ptr<SessionSocketServer>> Start(const std::string& path,
                                                                    GpuTier& tier,
                                                                    SessionOptions options);
  // Shutdown(), then joins every thread.
  ~SessionSocketServer();
  SessionSocketServer(const SessionSocketServer&) = delete;
  SessionSocketServer& operator=(const SessionSocketServer&) = delete;

  // Refuses new connections and removes the socket file; sessions already open go on.
  // Idempotent.
  void StopAccepting() ABSL_LOCKS_EXCLUDED(mu_);
  // StopAccepting(), then ends every session (what they hold is released). Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& path() const { return path_; }

 private:
  struct Connection;
  SessionSocketServer(std::string path, int listen_fd, GpuTier& tier, SessionOptions options);
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Serve(const std::shared_ptr<Connection>& connection);
  static void Enqueue(const std::shared_ptr<Connection>& connection, std::string frame);
  static void WriteLoop(const std::shared_ptr<Connection>& connection);
  // Joins and forgets connections whose sessions are over.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int listen_fd_;
  GpuTier& tier_;
  const SessionOptions options_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // accepting no more
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // sessions ended
  std::list<std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_SESSION_SOCKET_SERVER_H_
