#include "server/session_socket_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "common/session_socket.h"
#include "server/unix_socket.h"

namespace tierd {

struct SessionSocketServer::Connection {
  explicit Connection(int fd) : fd(fd) {}
  ~Connection() { ::close(fd); }

  const int fd;
  absl::Mutex mu;
  std::deque<std::string> queue ABSL_GUARDED_BY(mu);  // frames (or their rests) not yet sent
  uint64_t queued_bytes ABSL_GUARDED_BY(mu) = 0;
  bool writer_busy ABSL_GUARDED_BY(mu) = false;  // sending the frame it took off the queue
  bool closed ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;  // the reader is done: ready to be joined
  std::thread reader;
  std::thread writer;
};

absl::StatusOr<std::unique_ptr<SessionSocketServer>> SessionSocketServer::Start(
    const std::string& path, GpuTier& tier, SessionOptions options) {
  if (absl::Status prepared = PrepareSocketPath(path); !prepared.ok()) return prepared;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("creating the session socket", errno);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);  // PrepareSocketPath checked it
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::chmod(path.c_str(), 0660) != 0 || ::listen(fd, 128) != 0) {
    const int error = errno;
    ::close(fd);
    return PosixError(absl::StrCat("listening on ", path), error);
  }
  std::unique_ptr<SessionSocketServer> server(
      new SessionSocketServer(path, fd, tier, std::move(options)));
  server->acceptor_ = std::thread([raw = server.get()] { raw->AcceptLoop(); });
  return server;
}

SessionSocketServer::SessionSocketServer(std::string path, int listen_fd, GpuTier& tier,
                                         SessionOptions options)
    : path_(std::move(path)), listen_fd_(listen_fd), tier_(tier), options_(std::move(options)) {}

SessionSocketServer::~SessionSocketServer() {
  Shutdown();
  ::close(listen_fd_);
}

void SessionSocketServer::StopAccepting() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  acceptor_.join();
  ::unlink(path_.c_str());
}

void SessionSocketServer::Shutdown() {
  StopAccepting();
  std::list<std::shared_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
    connections.swap(connections_);
  }
  for (const std::shared_ptr<Connection>& connection : connections) {
    ::shutdown(connection->fd, SHUT_RDWR);  // the reader sees the end and closes the session
  }
  for (const std::shared_ptr<Connection>& connection : connections) connection->reader.join();
}

void SessionSocketServer::AcceptLoop() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno != EINTR && errno != ECONNABORTED) {
        TIERD_LOG(WARNING) << "accepting on " << path_ << ": " << std::strerror(errno);
      }
      continue;
    }
    ReapLocked();
    auto connection = std::make_shared<Connection>(fd);
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
  std::string hello(kSessionSocketHello.size(), '\0');
  std::shared_ptr<SessionProtocol> protocol;
  if (ReadExactly(connection->fd, hello.data(), hello.size()).ok() &&
      hello == kSessionSocketHello && SendAll(connection->fd, kSessionSocketHello).ok()) {
    connection->writer = std::thread([connection] { WriteLoop(connection); });
    protocol = std::make_shared<SessionProtocol>(
        tier_, options_, [weak = std::weak_ptr<Connection>(connection)](v1::SessionResponse r) {
          if (std::shared_ptr<Connection> live = weak.lock()) {
            Enqueue(live, EncodeFrame(r.SerializeAsString()));
          }
        });
    std::string payload;
    v1::SessionRequest request;
    while (true) {
      absl::Status status = ReadFrame(connection->fd, payload);
      if (!status.ok()) {
        if (!absl::IsOutOfRange(status) && !absl::IsUnavailable(status)) {
          TIERD_LOG(WARNING) << "session socket: " << status << "; closing the session";
        }
        break;
      }
      if (!request.ParseFromString(payload)) {
        TIERD_LOG(WARNING) << "session socket: a request that is no SessionRequest; closing the "
                              "session";
        break;
      }
      protocol->Handle(request);
    }
    protocol->Close();
  }
  {
    absl::MutexLock lock(&connection->mu);
    connection->closed = true;
  }
  ::shutdown(connection->fd, SHUT_RDWR);  // a writer blocked in send() gives up
  if (connection->writer.joinable()) connection->writer.join();
  absl::MutexLock lock(&connection->mu);
  connection->finished = true;
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
      connection->closed = true;
      ::shutdown(connection->fd, SHUT_RDWR);
      return;
    }
    if (sent > 0) frame.erase(0, static_cast<size_t>(sent));
  }
  if (connection->queued_bytes + frame.size() > kMaxQueuedBytes) {
    TIERD_LOG(WARNING) << "session socket: the client has not read "
                       << connection->queued_bytes << " bytes of answers; closing its session";
    connection->closed = true;
    ::shutdown(connection->fd, SHUT_RDWR);
    return;
  }
  connection->queued_bytes += frame.size();
  connection->queue.push_back(std::move(frame));
}

void SessionSocketServer::WriteLoop(const std::shared_ptr<Connection>& connection) {
  while (true) {
    std::string frame;
    {
      absl::MutexLock lock(&connection->mu);
      connection->mu.Await(absl::Condition(
          +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
            return c->closed || !c->queue.empty();
          },
          connection.get()));
      if (connection->closed) return;
      frame = std::move(connection->queue.front());
      connection->queue.pop_front();
      connection->writer_busy = true;
    }
    const absl::Status sent = SendAll(connection->fd, frame);
    absl::MutexLock lock(&connection->mu);
    connection->writer_busy = false;
    connection->queued_bytes -= frame.size();
    if (!sent.ok()) {
      connection->closed = true;
      ::shutdown(connection->fd, SHUT_RDWR);
      return;
    }
  }
}

}  // namespace tierd
