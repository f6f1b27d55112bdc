#include "bench/worker_processes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "common/posix_error.h"

namespace tierd::bench {
namespace {

constexpr size_t kLengthBytes = 4;
// A bound on one message, so that a corrupt length cannot make the reader allocate without end.
constexpr uint32_t kMaxMessageBytes = 1u << 30;

// poll()'s timeout: -1 (none) for an infinite deadline, else the milliseconds left, rounded up.
int MillisecondsUntil(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30));
}

// Reads what `fd` has into `buffer`. Returns false at the end of the input or on an error.
bool ReadAvailable(int fd, std::string& buffer) {
  char chunk[64 << 10];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n > 0) {
      buffer.append(chunk, static_cast<size_t>(n));
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

double CpuSeconds(const struct rusage& usage) {
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

}  // namespace

std::string FrameMessage(absl::string_view message) {
  const uint32_t length = static_cast<uint32_t>(message.size());
  std::string framed(kLengthBytes, '\0');
  for (size_t i = 0; i < kLengthBytes; ++i)
    framed[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  framed.append(message.data(), message.size());
  return framed;
}

bool TakeMessage(std::string& buffer, std::string& message) {
  if (buffer.size() < kLengthBytes) return false;
  uint32_t length = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) {
    length |= static_cast<uint32_t>(static_cast<uint8_t>(buffer[i])) << (8 * i);
  }
  if (buffer.size() < kLengthBytes + length) return false;
  message = buffer.substr(kLengthBytes, length);
  buffer.erase(0, kLengthBytes + length);
  return true;
}

absl::StatusOr<std::string> WorkerChannel::Receive(absl::Time deadline) {
  std::string message;
  while (!TakeMessage(received_, message)) {
    struct pollfd waiting = {from_parent_.get(), POLLIN, 0};
    const int ready = ::poll(&waiting, 1, MillisecondsUntil(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return PosixError("poll on the pipe from the parent", errno);
    if (ready == 0) return absl::DeadlineExceededError("no message from the parent in time");
    if (!ReadAvailable(from_parent_.get(), received_)) {
      return absl::UnavailableError("the parent closed the pipe");
    }
  }
  return message;
}

absl::Status WorkerChannel::Send(absl::string_view message) {
  if (message.size() > kMaxMessageBytes) return absl::InvalidArgumentError("message too large");
  absl::Status status = WriteAll(to_parent_.get(), FrameMessage(message), "the pipe to the parent");
  if (!status.ok()) return absl::UnavailableError(status.message());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WorkerProcesses>> WorkerProcesses::Start(int count,
                                                                        const Body& body) {
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, nullptr);
  std::unique_ptr<WorkerProcesses> processes(new WorkerProcesses());
  const pid_t parent = ::getpid();
  for (int index = 0; index < count; ++index) {
    int to_worker[2];
    int from_worker[2];
    if (::pipe2(to_worker, O_CLOEXEC) != 0) return PosixError("pipe", errno);
    ScopedFd to_worker_read(to_worker[0]), to_worker_write(to_worker[1]);
    if (::pipe2(from_worker, O_CLOEXEC) != 0) return PosixError("pipe", errno);
    ScopedFd from_worker_read(from_worker[0]), from_worker_write(from_worker[1]);
    const pid_t pid = ::fork();
    if (pid < 0) return PosixError("fork", errno);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);  // the parent died before the call above
      // The ends of the parent and of the workers forked before this one are not ours.
      for (Worker& other : processes->workers_) {
        ::close(other.to_worker.Release());
        ::close(other.from_worker.Release());
      }
      ::close(to_worker_write.Release());
      ::close(from_worker_read.Release());
      int status;
      {
        WorkerChannel channel(to_worker_read.Release(), from_worker_write.Release());
        status = body(index, channel);
      }
      ::_exit(status);
    }
    Worker worker;
    worker.pid = pid;
    worker.to_worker = std::move(to_worker_write);
    worker.from_worker = std::move(from_worker_read);
    processes->workers_.push_back(std::move(worker));
  }
  return processes;
}

WorkerProcesses::~WorkerProcesses() {
  for (Worker& worker : workers_) {
    if (worker.reaped) continue;
    ::kill(worker.pid, SIGKILL);
    ::waitpid(worker.pid, nullptr, 0);
  }
}

absl::Status WorkerProcesses::Send(int worker, absl::string_view message) {
  if (message.size() > kMaxMessageBytes) return absl::InvalidArgumentError("message too large");
  Worker& to = workers_[worker];
  if (to.to_worker.get() < 0) return absl::UnavailableError("the pipe to the worker is closed");
  absl::Status status = WriteAll(to.to_worker.get(), FrameMessage(message),
                                 absl::StrCat("the pipe to worker ", worker));
  if (!status.ok()) return absl::UnavailableError(status.message());
  return absl::OkStatus();
}

std::map<int, absl::StatusOr<std::string>> WorkerProcesses::ReceiveFromEach(
    const std::vector<int>& workers, absl::Time deadline) {
  std::map<int, absl::StatusOr<std::string>> received;
  std::vector<int> waiting_for;
  for (int index : workers) {
    std::string message;
    if (TakeMessage(workers_[index].received, message)) {
      received.emplace(index, std::move(message));
    } else if (workers_[index].from_worker.get() < 0) {
      received.emplace(index, absl::UnavailableError("the worker closed its pipe"));
    } else {
      waiting_for.push_back(index);
    }
  }
  while (!waiting_for.empty()) {
    std::vector<struct pollfd> fds;
    for (int index : waiting_for) fds.push_back({workers_[index].from_worker.get(), POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), MillisecondsUntil(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    std::vector<int> still_waiting;
    for (size_t i = 0; i < fds.size(); ++i) {
      const int index = waiting_for[i];
      Worker& worker = workers_[index];
      if (fds[i].revents == 0) {
        still_waiting.push_back(index);
        continue;
      }
      if (!ReadAvailable(worker.from_worker.get(), worker.received)) {
        worker.from_worker = ScopedFd(-1);
        received.emplace(index, absl::UnavailableError("the worker ended without sending it"));
        continue;
      }
      std::string message;
      if (TakeMessage(worker.received, message)) {
        received.emplace(index, std::move(message));
      } else {
        still_waiting.push_back(index);
      }
    }
    waiting_for = std::move(still_waiting);
  }
  for (int index : waiting_for) {
    received.emplace(index, absl::DeadlineExceededError("no message from the worker in time"));
  }
  return received;
}

std::vector<WorkerExit> WorkerProcesses::Reap(absl::Time deadline) {
  for (Worker& worker : workers_) {
    worker.to_worker = ScopedFd(-1);
    worker.from_worker = ScopedFd(-1);
  }
  std::vector<WorkerExit> exits(workers_.size());
  std::vector<bool> killed(workers_.size(), false);
  for (;;) {
    bool running = false;
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& worker = workers_[i];
      if (worker.reaped) continue;
      int status = 0;
      struct rusage usage = {};
      const pid_t done = ::wait4(worker.pid, &status, killed[i] ? 0 : WNOHANG, &usage);
      if (done == worker.pid || (done < 0 && errno != EINTR)) {
        worker.reaped = true;
        exits[i].clean = done == worker.pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
        exits[i].how = done == worker.pid ? DescribeWaitStatus(status) : "could not be waited for";
        if (killed[i]) absl::StrAppend(&exits[i].how, " (after the deadline)");
        exits[i].cpu_seconds = CpuSeconds(usage);
      } else {
        running = true;
      }
    }
    if (!running) break;
    if (absl::Now() >= deadline) {
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (!workers_[i].reaped && !killed[i]) {
          ::kill(workers_[i].pid, SIGKILL);
          killed[i] = true;
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return exits;
}

}  // namespace tierd::bench
