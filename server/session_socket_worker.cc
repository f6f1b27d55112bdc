#include "server/session_socket_worker.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "common/deferred_calls.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "server/parse_failure.h"
#include "wire/frame_decoder.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

// Reads one event may make of one connection before the loop turns to the others.
constexpr int kReadsPerEvent = 4;
constexpr int kEventsPerWait = 64;

}  // namespace

struct SessionSocketWorker::Connection {
  Connection(int fd, int epoll_fd, UnreadAnswerBudget& budget)
      : fd(fd), epoll_fd(epoll_fd), unread(budget) {}

  // Gives epoll the events the connection waits for now.
  void WatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    epoll_event event{};
    event.events = (reading ? EPOLLIN | EPOLLRDHUP : 0u) | (writing ? EPOLLOUT : 0u);
    event.data.ptr = this;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &event);
  }
  // Nothing more is sent: the queue's memory and its share of the budget go back at once, and the
  // socket is shut down both ways, which the worker sees as a hang-up and ends the connection.
  void ShutDownLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (closed) return;
    closed = true;
    ::shutdown(fd, SHUT_RDWR);
    DropQueueLocked();
  }
  void DropQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    uint64_t dropped = 0;
    for (const std::string& frame : queue) dropped += frame.size();
    std::deque<std::string>().swap(queue);
    unread.Release(dropped);
    ReturnMemoryAfterDropping(dropped);
  }
  // Sends what is queued as far as the socket takes it; once all is sent, stops watching for
  // room, and closes the connection if its session has ended after a half-close.
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!closed && !queue.empty()) {
      std::string& frame = queue.front();
      const ssize_t sent = ::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        ShutDownLocked();
        return;
      }
      unread.Release(static_cast<uint64_t>(sent));
      if (static_cast<size_t>(sent) < frame.size()) {
        frame.erase(0, static_cast<size_t>(sent));
      } else {
        queue.pop_front();
      }
    }
    if (closed) return;
    writing = false;
    WatchLocked();
    if (answered) ShutDownLocked();  // every answer is in the client's socket: it reads, then EOF
  }

  // The socket. Closed by the worker in End(), under mu after setting `closed`: whoever holds mu
  // and sees `closed` false may use it; the worker may use it without mu until it closes it.
  const int fd;
  const int epoll_fd;

  absl::Mutex mu;
  std::deque<std::string> queue ABSL_GUARDED_BY(mu);       // frames (or their rests) not yet sent
  UnreadAnswerBudget::Account unread ABSL_GUARDED_BY(mu);  // the bytes of `queue`
  bool reading ABSL_GUARDED_BY(mu) = true;    // watching for requests: until a half-close
  bool writing ABSL_GUARDED_BY(mu) = false;   // watching for room: answers are queued
  bool answered ABSL_GUARDED_BY(mu) = false;  // half-closed, and the session ended: close once sent
  bool closed ABSL_GUARDED_BY(mu) = false;    // nothing more is sent

  // The worker's own.
  std::optional<pid_t> peer_pid;  // SO_PEERCRED
  std::string greeting;           // the greeting's bytes as they come
  bool greeted = false;
  bool half_closed = false;
  absl::Time deadline = absl::InfiniteFuture();  // of the greeting, or of a frame begun
  FrameDecoder frames;
  std::shared_ptr<SessionProtocol> protocol;  // once greeted
};

absl::StatusOr<std::unique_ptr<SessionSocketWorker>> SessionSocketWorker::Start(
    GpuTier& tier, SessionOptions options, absl::Duration busy_poll, Limits limits,
    UnreadAnswerBudget& unread_answers, std::function<void()> on_connection_end) {
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return PosixError("creating the session socket's epoll", errno);
  const int wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int error = errno;
    ::close(epoll_fd);
    return PosixError("creating the session socket's eventfd", error);
  }
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.ptr = nullptr;  // no connection
  if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &wake) != 0) {
    const int error = errno;
    ::close(wake_fd);
    ::close(epoll_fd);
    return PosixError("watching the session socket's eventfd", error);
  }
  std::unique_ptr<SessionSocketWorker> worker(
      new SessionSocketWorker(epoll_fd, wake_fd, tier, std::move(options), busy_poll, limits,
                              unread_answers, std::move(on_connection_end)));
  worker->thread_ = std::thread([raw = worker.get()] { raw->Loop(); });
  return worker;
}

SessionSocketWorker::SessionSocketWorker(int epoll_fd, int wake_fd, GpuTier& tier,
                                         SessionOptions options, absl::Duration busy_poll,
                                         Limits limits, UnreadAnswerBudget& unread_answers,
                                         std::function<void()> on_connection_end)
    : epoll_fd_(epoll_fd),
      wake_fd_(wake_fd),
      tier_(tier),
      options_(std::move(options)),
      busy_poll_(busy_poll),
      limits_(limits),
      unread_answers_(unread_answers),
      on_connection_end_(std::move(on_connection_end)),
      read_buffer_(FrameReader::kBufferBytes) {}

SessionSocketWorker::~SessionSocketWorker() {
  Stop();
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

namespace {

void Wake(int wake_fd) {
  const uint64_t one = 1;
  // Only fails when the counter is full, and then the loop is awake already.
  [[maybe_unused]] const ssize_t written = ::write(wake_fd, &one, sizeof(one));
}

}  // namespace

void SessionSocketWorker::Add(int fd) {
  connections_.fetch_add(1, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      added_.push_back(fd);
      Wake(wake_fd_);
      return;
    }
  }
  ::close(fd);
  connections_.fetch_sub(1, std::memory_order_relaxed);
  on_connection_end_();
}

void SessionSocketWorker::Stop() {
  absl::MutexLock serialize(&stop_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake(wake_fd_);
  if (thread_.joinable()) thread_.join();
}

bool SessionSocketWorker::TakeAdded() {
  std::vector<int> added;
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    added.swap(added_);
    stopping = stopping_;
  }
  for (const int fd : added) Open(fd);
  if (!stopping) return true;
  std::vector<std::shared_ptr<Connection>> open;
  for (auto& [raw, connection] : open_) open.push_back(connection);
  for (const std::shared_ptr<Connection>& connection : open) End(connection);
  return false;
}

void SessionSocketWorker::Open(int fd) {
  auto connection = std::make_shared<Connection>(fd, epoll_fd_, unread_answers_);
  // The client's process, as the kernel says it connected: what its host leases are held for.
  ucred peer{};
  socklen_t peer_size = sizeof(peer);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_size) == 0 && peer.pid > 0) {
    connection->peer_pid = peer.pid;
  }
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP;
  event.data.ptr = connection.get();
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
    TIERD_LOG_EVERY_N_SEC(WARNING, 10)
        << "session socket: watching a new connection: " << std::strerror(errno) << "; closing it";
    ::close(fd);
    connections_.fetch_sub(1, std::memory_order_relaxed);
    on_connection_end_();
    return;
  }
  connection->deadline = absl::Now() + limits_.greeting_timeout;
  next_deadline_ = std::min(next_deadline_, connection->deadline);
  // Cut by another connection's charge when this one holds the most unread answers.
  {
    absl::MutexLock lock(&connection->mu);
    connection->unread.OnCut([weak = std::weak_ptr<Connection>(connection)] {
      if (std::shared_ptr<Connection> live = weak.lock()) {
        absl::MutexLock lock(&live->mu);
        live->ShutDownLocked();
      }
    });
  }
  open_.emplace(connection.get(), std::move(connection));
}

void SessionSocketWorker::Loop() {
  std::vector<epoll_event> events(kEventsPerWait);
  absl::Time last_served = absl::InfinitePast();
  while (true) {
    const absl::Time now = absl::Now();
    if (now >= next_deadline_) next_deadline_ = EndOverdue(now);
    const bool polling = busy_poll_ > absl::ZeroDuration() && now - last_served < busy_poll_;
    int timeout_ms = -1;
    if (polling) {
      timeout_ms = 0;
    } else if (next_deadline_ != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(next_deadline_ - now, absl::Milliseconds(1))), 1,
          std::numeric_limits<int>::max()));
    }
    const int ready = ::epoll_wait(epoll_fd_, events.data(), kEventsPerWait, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      // Only a bad descriptor or argument gets here: nothing this loop could recover from.
      TIERD_LOG(ERROR) << "session socket: epoll_wait: " << std::strerror(errno);
      std::abort();
    }
    if (ready == 0) {
      if (polling) ::sched_yield();
      continue;
    }
    for (int i = 0; i < ready; ++i) {
      auto* raw = static_cast<Connection*>(events[i].data.ptr);
      if (raw == nullptr) {
        uint64_t count;
        [[maybe_unused]] const ssize_t read = ::read(wake_fd_, &count, sizeof(count));
        if (!TakeAdded()) return;
        continue;
      }
      const auto it = open_.find(raw);
      if (it == open_.end()) continue;
      const std::shared_ptr<Connection> connection = it->second;
      OnEvents(connection, events[i].events);
    }
    last_served = absl::Now();
  }
}

void SessionSocketWorker::OnEvents(const std::shared_ptr<Connection>& connection, uint32_t events) {
  bool closed;
  {
    absl::MutexLock lock(&connection->mu);
    if ((events & EPOLLOUT) != 0) connection->FlushLocked();
    closed = connection->closed;
  }
  if (closed) {
    // Cut, or every answer sent after a half-close: nothing more is read, let alone handled.
    End(connection);
    return;
  }
  if (!connection->half_closed && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0 &&
      !ReadRequests(connection)) {
    End(connection);
    return;
  }
  // A hang-up: the client closed its end altogether (or the connection broke). What
  // it sent before was read above, down to the end of the stream; nobody reads the answers.
  if ((events & (EPOLLHUP | EPOLLERR)) != 0 && connection->half_closed) End(connection);
}

bool SessionSocketWorker::ReadRequests(const std::shared_ptr<Connection>& connection) {
  for (int reads = 0; reads < kReadsPerEvent; ++reads) {
    const ssize_t read =
        ::recv(connection->fd, read_buffer_.data(), read_buffer_.size(), MSG_DONTWAIT);
    if (read > 0) {
      if (!Take(connection, absl::string_view(read_buffer_.data(), static_cast<size_t>(read)))) {
        return false;
      }
      if (static_cast<size_t>(read) < read_buffer_.size()) return true;  // likely all there was
      continue;
    }
    if (read == 0) {
      // The end of the stream. Between frames, a half-close; inside one (or the greeting), the
      // client went away mid-message.
      if (!connection->greeted || connection->frames.mid_frame()) return false;
      OnHalfClose(connection);
      return true;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    if (errno != ECONNRESET && errno != EPIPE) {
      TIERD_LOG_EVERY_N_SEC(WARNING, 10)
          << "session socket: reading: " << std::strerror(errno) << "; closing the session";
    }
    return false;
  }
  return true;
}

bool SessionSocketWorker::Take(const std::shared_ptr<Connection>& connection,
                               absl::string_view bytes) {
  if (!connection->greeted) {
    const absl::string_view hello = SessionSocketHello();
    const size_t take = std::min(hello.size() - connection->greeting.size(), bytes.size());
    connection->greeting.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (connection->greeting.size() < hello.size()) return true;
    if (connection->greeting != hello) return false;
    connection->greeted = true;
    connection->deadline = absl::InfiniteFuture();
    Enqueue(connection, std::string(hello));
    connection->protocol = std::make_shared<SessionProtocol>(
        tier_, options_,
        [weak = std::weak_ptr<Connection>(connection)](v1::SessionResponse r) {
          if (std::shared_ptr<Connection> live = weak.lock()) Enqueue(live, EncodeFrame(r));
        },
        connection->peer_pid);
  }
  if (bytes.empty()) return true;
  const size_t frames_before = connection->frames.frames();
  bool undecodable = false;
  const absl::Status fed = connection->frames.Feed(bytes, [&](absl::string_view payload) {
    if (!request_.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      // The description names fields of the proto, never the client's bytes; escaped all the
      // same, as everything a client can influence that reaches the log. A client may send many
      // such frames over as many connections: at most a line per 10 s.
      TIERD_LOG_EVERY_N_SEC(WARNING, 10)
          << "session socket: "
          << absl::CEscape(UndecodableRequest(*v1::SessionRequest::descriptor(), payload).message())
          << "; closing the session";
      undecodable = true;
      return false;
    }
    connection->protocol->Handle(request_);
    return true;
  });
  if (!fed.ok()) {
    TIERD_LOG_EVERY_N_SEC(WARNING, 10) << "session socket: " << fed << "; closing the session";
    return false;
  }
  if (undecodable) return false;
  if (!connection->frames.mid_frame()) {
    connection->deadline = absl::InfiniteFuture();
  } else if (connection->frames.frames() != frames_before ||
             connection->deadline == absl::InfiniteFuture()) {
    // A frame began in these bytes: its rest is due within the frame timeout.
    connection->deadline = absl::Now() + limits_.frame_timeout;
    next_deadline_ = std::min(next_deadline_, connection->deadline);
  }
  return true;
}

void SessionSocketWorker::OnHalfClose(const std::shared_ptr<Connection>& connection) {
  connection->half_closed = true;
  connection->deadline = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&connection->mu);
    connection->reading = false;  // the end of the stream stays readable: no more of it
    if (!connection->closed) connection->WatchLocked();
  }
  connection->protocol->CloseWhenAnswered([weak = std::weak_ptr<Connection>(connection)] {
    if (std::shared_ptr<Connection> live = weak.lock()) {
      absl::MutexLock lock(&live->mu);
      live->answered = true;
      if (live->queue.empty()) live->ShutDownLocked();  // else once the queue is sent
    }
  });
}

void SessionSocketWorker::End(const std::shared_ptr<Connection>& connection) {
  if (connection->protocol != nullptr) connection->protocol->Close();
  {
    absl::MutexLock lock(&connection->mu);
    connection->closed = true;
    connection->DropQueueLocked();
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, connection->fd, nullptr);
    ::close(connection->fd);
  }
  open_.erase(connection.get());
  connections_.fetch_sub(1, std::memory_order_relaxed);
  on_connection_end_();
}

absl::Time SessionSocketWorker::EndOverdue(absl::Time now) {
  std::vector<std::shared_ptr<Connection>> overdue;
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [raw, connection] : open_) {
    if (connection->deadline <= now) {
      overdue.push_back(connection);
    } else {
      next = std::min(next, connection->deadline);
    }
  }
  for (const std::shared_ptr<Connection>& connection : overdue) {
    // What the client sent may be in the socket already, unread because this thread was held up
    // (a stalled worker must not cut clients whose bytes arrived in time): read it first.
    if (!ReadRequests(connection)) {
      End(connection);
      continue;
    }
    if (connection->deadline > now) {
      next = std::min(next, connection->deadline);
      continue;
    }
    if (connection->greeted) {
      // A client may hold many connections this way: at most a line per 10 s.
      TIERD_LOG_EVERY_N_SEC(WARNING, 10)
          << "session socket: a request begun " << absl::FormatDuration(limits_.frame_timeout)
          << " ago is still incomplete; closing the session";
    }
    End(connection);
  }
  return next;
}

void SessionSocketWorker::Enqueue(const std::shared_ptr<Connection>& connection,
                                  std::string frame) {
  DeferredCalls cuts;  // of other connections, holding more, after this one's lock
  absl::MutexLock lock(&connection->mu);
  if (connection->closed) return;
  if (connection->queue.empty()) {
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
  if (absl::Status charged = connection->unread.Charge(frame.size(), cuts.calls()); !charged.ok()) {
    // Cutting is what keeps a client from holding the daemon's memory; the log line is for the
    // operator, and a client may cause many: at most one per 10 s.
    TIERD_LOG_EVERY_N_SEC(WARNING, 10)
        << "session socket: " << charged.message() << "; closing its session";
    connection->ShutDownLocked();
    return;
  }
  connection->queue.push_back(std::move(frame));
  if (!connection->writing) {
    connection->writing = true;
    connection->WatchLocked();
  }
}

}  // namespace tierd
