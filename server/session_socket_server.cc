#include "server/session_socket_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "server/parse_failure.h"
#include "server/unix_socket.h"
#include "wire/session_socket.h"

namespace tierd {

struct SessionSocketServer::Connection {
  Connection(int fd, UnreadAnswerBudget& budget) : fd(fd), unread(budget) {}
  ~Connection() {
    if (fd >= 0) ::close(fd);
  }

  // Shuts the socket down (waking its reader and writer) unless it is closed already.
  void ShutDown() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    ShutDownLocked();
  }
  // Nothing queued is sent any more: its memory and its share of the budget go back at once.
  void ShutDownLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    closed = true;
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    uint64_t dropped = 0;
    for (const std::string& frame : queue) dropped += frame.size();
    std::deque<std::string>().swap(queue);
    unread.Release(dropped);
    ReturnMemoryAfterDropping(dropped);
  }

  absl::Mutex mu;
  // Closed by the reader once the writer is joined, under mu: whoever holds mu and sees it >= 0
  // may use it.
  int fd ABSL_GUARDED_BY(mu);
  std::deque<std::string> queue ABSL_GUARDED_BY(mu);  // frames (or their rests) not yet sent
  // The bytes of `queue` and of the frame the writer is sending, charged to the daemon's budget.
  UnreadAnswerBudget::Account unread ABSL_GUARDED_BY(mu);
  bool writer_busy ABSL_GUARDED_BY(mu) = false;  // sending the frame it took off the queue
  bool reads_done ABSL_GUARDED_BY(mu) = false;   // the client half-closed: send what is queued
  bool closed ABSL_GUARDED_BY(mu) = false;       // nothing more is sent
  bool finished ABSL_GUARDED_BY(mu) = false;     // the reader is done: ready to be joined
  std::thread reader;
  std::thread writer;  // started and joined by the reader
};

absl::StatusOr<std::unique_ptr<SessionSocketServer>> SessionSocketServer::Start(
    const std::string& path, std::optional<gid_t> group, GpuTier& tier, SessionOptions options,
    UnreadAnswerBudget& unread_answers) {
  if (absl::Status prepared = PrepareSocketPath(path); !prepared.ok()) return prepared;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("creating the session socket", errno);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);  // PrepareSocketPath checked it
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    ::close(fd);
    return PosixError(absl::StrCat("binding ", path), error);
  }
  if (absl::Status access = SetSocketAccess(path, group); !access.ok()) {
    ::close(fd);
    ::unlink(path.c_str());
    return access;
  }
  if (::listen(fd, 128) != 0) {
    const int error = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return PosixError(absl::StrCat("listening on ", path), error);
  }
  std::unique_ptr<SessionSocketServer> server(
      new SessionSocketServer(path, fd, tier, std::move(options), unread_answers));
  server->acceptor_ = std::thread([raw = server.get()] { raw->AcceptLoop(); });
  return server;
}

SessionSocketServer::SessionSocketServer(std::string path, int listen_fd, GpuTier& tier,
                                         SessionOptions options, UnreadAnswerBudget& unread_answers)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      tier_(tier),
      options_(std::move(options)),
      unread_answers_(unread_answers) {}

SessionSocketServer::~SessionSocketServer() {
  Shutdown(absl::Now());
  ::close(listen_fd_);
}

void SessionSocketServer::StopAccepting() {
  absl::MutexLock lock(&shutdown_mu_);
  StopAcceptingLocked();
}

void SessionSocketServer::StopAcceptingLocked() {
  if (!accepting_) return;
  accepting_ = false;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  acceptor_.join();
  ::unlink(path_.c_str());
}

void SessionSocketServer::Shutdown(absl::Time deadline) {
  absl::MutexLock serialize(&shutdown_mu_);
  StopAcceptingLocked();
  std::list<std::shared_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    // Sessions their clients end within the grace end on their own.
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](int* active) { return *active == 0; }, &active_),
                          deadline);
    connections.swap(connections_);
  }
  for (const std::shared_ptr<Connection>& connection : connections) connection->ShutDown();
  for (const std::shared_ptr<Connection>& connection : connections) connection->reader.join();
}

void SessionSocketServer::AcceptLoop() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    const int error = errno;
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    ReapLocked();
    if (fd < 0) {
      if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
        // Out of descriptors or memory: the connection waits in the backlog; try again later
        // rather than spin.
        TIERD_LOG(WARNING) << "accepting on " << path_ << ": " << std::strerror(error)
                           << "; retrying in 100 ms";
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
      } else if (error != EINTR && error != ECONNABORTED) {
        TIERD_LOG(WARNING) << "accepting on " << path_ << ": " << std::strerror(error);
      }
      continue;
    }
    if (active_ >= kMaxConnections) {
      TIERD_LOG(WARNING) << "session socket: " << active_ << " connections already; refusing one";
      ::close(fd);
      continue;
    }
    ++active_;
    auto connection = std::make_shared<Connection>(fd, unread_answers_);
    connection->reader = std::thread([this, connection] { Serve(connection); });
    connections_.push_back(std::move(connection));
  }
}

void SessionSocketServer::ReapLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    bool finished;
    {
      absl::MutexLock lock(&(*it)->mu);
      finished = (*it)->finished;
    }
    if (finished) {
      (*it)->reader.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void SessionSocketServer::Serve(const std::shared_ptr<Connection>& connection) {
  int fd;
  {
    absl::MutexLock lock(&connection->mu);
    fd = connection->fd;  // stays open until this thread closes it below
  }
  const auto set_receive_timeout = [fd](absl::Duration timeout) {
    const timeval value = absl::ToTimeval(timeout);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &value, sizeof(value));
  };
  set_receive_timeout(kGreetingTimeout);
  std::string hello(SessionSocketHello().size(), '\0');
  if (ReadExactly(fd, hello.data(), hello.size()).ok() && hello == SessionSocketHello() &&
      SendAll(fd, SessionSocketHello()).ok()) {
    set_receive_timeout(absl::ZeroDuration());
    connection->writer = std::thread([connection] { WriteLoop(connection); });
    auto protocol = std::make_shared<SessionProtocol>(
        tier_, options_, [weak = std::weak_ptr<Connection>(connection)](v1::SessionResponse r) {
          if (std::shared_ptr<Connection> live = weak.lock()) {
            Enqueue(live, EncodeFrame(r));
          }
        });
    std::string payload;
    v1::SessionRequest request;
    bool clean_end = false;
    FrameReader frames(fd, options_.busy_poll);
    while (true) {
      absl::Status status = frames.Next(payload, kFrameTimeout);
      if (!status.ok()) {
        clean_end = absl::IsOutOfRange(status);
        if (absl::IsDeadlineExceeded(status)) {
          // A client may hold many connections this way: at most a line per 10 s.
          TIERD_LOG_EVERY_N_SEC(WARNING, 10)
              << "session socket: a request begun " << absl::FormatDuration(kFrameTimeout)
              << " ago is still incomplete; closing the session";
        } else if (!clean_end && !absl::IsUnavailable(status)) {
          TIERD_LOG(WARNING) << "session socket: " << status << "; closing the session";
        }
        break;
      }
      if (!request.ParseFromString(payload)) {
        // The description names fields of the proto, never the client's bytes; escaped all the
        // same, as everything a client can influence that reaches the log. A client may send many
        // such frames over as many connections: at most a line per 10 s.
        TIERD_LOG_EVERY_N_SEC(WARNING, 10)
            << "session socket: "
            << absl::CEscape(
                   UndecodableRequest(*v1::SessionRequest::descriptor(), payload).message())
            << "; closing the session";
        break;
      }
      protocol->Handle(request);
    }
    if (clean_end) {
      // A half-close: the client still reads. The answers to its requests in flight go out, then
      // the session closes and the writer, having sent everything, ends.
      protocol->CloseWhenAnswered([weak = std::weak_ptr<Connection>(connection)] {
        if (std::shared_ptr<Connection> live = weak.lock()) {
          absl::MutexLock lock(&live->mu);
          live->reads_done = true;
        }
      });
      WaitForAnswersUnlessHungUp(*connection, fd);
    }
    protocol->Close();  // unless the wait above has: no half-close, a hang-up or a shutdown
    if (!clean_end) connection->ShutDown();
    connection->writer.join();
  }
  {
    absl::MutexLock lock(&connection->mu);
    connection->ShutDownLocked();
    ::close(connection->fd);
    connection->fd = -1;
  }
  // Last, and in the lock order (mu_, then the connection's): once `finished` is set the acceptor
  // may join this thread while holding mu_, so nothing after it may wait for mu_.
  absl::MutexLock lock(&mu_);
  --active_;
  absl::MutexLock connection_lock(&connection->mu);
  connection->finished = true;
}

void SessionSocketServer::WaitForAnswersUnlessHungUp(Connection& connection, int fd) {
  while (true) {
    {
      absl::MutexLock lock(&connection.mu);
      const auto answered_or_closed = [](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
        return c->reads_done || c->closed;
      };
      if (connection.mu.AwaitWithTimeout(absl::Condition(+answered_or_closed, &connection),
                                         kHangUpCheckPeriod)) {
        return;
      }
    }
    // A half-closed client that now closes its end too (or a broken connection) is told apart by
    // POLLHUP, which a Unix stream socket reports once both directions are shut.
    pollfd hang_up{fd, 0, 0};
    if (::poll(&hang_up, 1, 0) > 0 && (hang_up.revents & (POLLHUP | POLLERR)) != 0) return;
  }
}

void SessionSocketServer::Enqueue(const std::shared_ptr<Connection>& connection,
                                  std::string frame) {
  absl::MutexLock lock(&connection->mu);
  if (connection->closed) return;
  if (connection->queue.empty() && !connection->writer_busy) {
    // The usual case: the socket has room, and the answer goes out on this thread.
    const ssize_t sent =
        ::send(connection->fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent == static_cast<ssize_t>(frame.size())) return;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      connection->ShutDownLocked();
      return;
    }
    if (sent > 0) frame.erase(0, static_cast<size_t>(sent));
  }
  if (absl::Status charged = connection->unread.Charge(frame.size()); !charged.ok()) {
    // Cutting is what keeps a client from holding the daemon's memory; the log line is for the
    // operator, and a client may cause many: at most one per 10 s.
    TIERD_LOG_EVERY_N_SEC(WARNING, 10)
        << "session socket: " << charged.message() << "; closing its session";
    connection->ShutDownLocked();
    return;
  }
  connection->queue.push_back(std::move(frame));
}

void SessionSocketServer::WriteLoop(const std::shared_ptr<Connection>& connection) {
  while (true) {
    std::string frame;
    int fd;
    {
      absl::MutexLock lock(&connection->mu);
      connection->mu.Await(absl::Condition(
          +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
            return c->closed || !c->queue.empty() || c->reads_done;
          },
          connection.get()));
      if (connection->closed || connection->queue.empty()) return;  // closed, or all sent
      frame = std::move(connection->queue.front());
      connection->queue.pop_front();
      connection->writer_busy = true;
      fd = connection->fd;  // the reader closes it only after joining this thread
    }
    const absl::Status sent = SendAll(fd, frame);
    absl::MutexLock lock(&connection->mu);
    connection->writer_busy = false;
    connection->unread.Release(frame.size());
    if (!sent.ok()) {
      connection->ShutDownLocked();
      return;
    }
  }
}

}  // namespace tierd
