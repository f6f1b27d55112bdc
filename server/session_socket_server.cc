#include "server/session_socket_server.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/machine.h"
#include "common/posix_error.h"
#include "server/unix_socket.h"

namespace tierd {

int DefaultSessionThreads() { return std::clamp(UsableCpus() / 4, 1, 4); }

absl::StatusOr<std::unique_ptr<SessionSocketServer>> SessionSocketServer::Start(
    const std::string& path, std::optional<gid_t> group, GpuTier& tier, SessionOptions options,
    SessionSocketOptions serving, UnreadAnswerBudget& unread_answers) {
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
  std::unique_ptr<SessionSocketServer> server(new SessionSocketServer(path, fd));
  const SessionSocketWorker::Limits limits{kGreetingTimeout, kFrameTimeout};
  for (int i = 0; i < serving.threads; ++i) {
    absl::StatusOr<std::unique_ptr<SessionSocketWorker>> worker =
        SessionSocketWorker::Start(tier, options, serving.busy_poll, limits, unread_answers,
                                   [raw = server.get()] { raw->OnConnectionEnd(); });
    if (!worker.ok()) {
      ::unlink(path.c_str());
      return worker.status();  // the server's destructor stops the workers started
    }
    server->workers_.push_back(*std::move(worker));
  }
  server->acceptor_ = std::thread([raw = server.get()] { raw->AcceptLoop(); });
  return server;
}

SessionSocketServer::SessionSocketServer(std::string path, int listen_fd)
    : path_(std::move(path)), listen_fd_(listen_fd) {}

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
  if (acceptor_.joinable()) acceptor_.join();
  ::unlink(path_.c_str());
}

void SessionSocketServer::Shutdown(absl::Time deadline) {
  absl::MutexLock serialize(&shutdown_mu_);
  StopAcceptingLocked();
  {
    absl::MutexLock lock(&mu_);
    // Sessions their clients end within the grace end on their own.
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](int* active) { return *active == 0; }, &active_),
                          deadline);
  }
  for (const std::unique_ptr<SessionSocketWorker>& worker : workers_) worker->Stop();
}

void SessionSocketServer::OnConnectionEnd() {
  absl::MutexLock lock(&mu_);
  --active_;
}

SessionSocketWorker& SessionSocketServer::LeastBusyWorker() const {
  SessionSocketWorker* least = workers_.front().get();
  for (const std::unique_ptr<SessionSocketWorker>& worker : workers_) {
    if (worker->connections() < least->connections()) least = worker.get();
  }
  return *least;
}

void SessionSocketServer::AcceptLoop() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    const int error = errno;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        if (fd >= 0) ::close(fd);
        return;
      }
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
    }
    LeastBusyWorker().Add(fd);
  }
}

}  // namespace tierd
