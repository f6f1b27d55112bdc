// Worker processes forked by a benchmark, and the framed messages that pass between them and the
// parent over one pipe each way.
//
// Fork before the parent creates any gRPC channel, CUDA context or thread: a forked child gets a
// copy of the parent's memory but only the forking thread, so such state would be broken in it.
// Every wait the parent makes has a deadline, so a worker that hangs or dies never hangs the
// parent: it gets an error for that worker instead.
#ifndef TIERD_BENCH_WORKER_PROCESSES_H_
#define TIERD_BENCH_WORKER_PROCESSES_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/fd_io.h"

namespace tierd::bench {

// A worker's end of its pipes. Used by the worker's threads one at a time (callers serialise).
class WorkerChannel {
 public:
  WorkerChannel(int from_parent, int to_parent)
      : from_parent_(from_parent), to_parent_(to_parent) {}

  // The next message from the parent. DEADLINE_EXCEEDED when none is complete by `deadline`;
  // UNAVAILABLE when the parent closed its end (it has gone, or wants no more).
  absl::StatusOr<std::string> Receive(absl::Time deadline);
  // Sends one message to the parent. UNAVAILABLE when the parent's end is closed.
  absl::Status Send(absl::string_view message);

 private:
  ScopedFd from_parent_;
  ScopedFd to_parent_;
  std::string received_;  // bytes read past the last whole message
};

// How a worker ended.
struct WorkerExit {
  bool clean = false;      // exited with status 0
  std::string how;         // "exited 0", "exited 3", "killed by signal 9 (after the deadline)"
  double cpu_seconds = 0;  // user + system time of the process
};

// The parent's side: the workers it forked and its ends of their pipes. Not thread-safe.
class WorkerProcesses {
 public:
  // What a worker runs: its index (0..count-1) and its channel; the return value is its exit
  // status. The worker then ends with _exit, running no atexit handlers or static destructors of
  // the parent's state.
  using Body = std::function<int(int index, WorkerChannel& channel)>;

  // Forks `count` workers running `body`. Each dies with the parent (PR_SET_PDEATHSIG). Ignores
  // SIGPIPE in the parent, so that writing to a dead worker is an error, not a signal.
  // Errors: those of pipe() and fork(); workers already forked are killed.
  static absl::StatusOr<std::unique_ptr<WorkerProcesses>> Start(int count, const Body& body);

  // Kills (SIGKILL) and reaps the workers not yet reaped.
  ~WorkerProcesses();
  WorkerProcesses(const WorkerProcesses&) = delete;
  WorkerProcesses& operator=(const WorkerProcesses&) = delete;

  int count() const { return static_cast<int>(workers_.size()); }
  pid_t pid(int worker) const { return workers_[worker].pid; }

  // Sends one message to `worker`. UNAVAILABLE when it has closed its end (it has ended).
  absl::Status Send(int worker, absl::string_view message);

  // Waits until each of `workers` has sent its next message, or `deadline`. Every one of them has
  // an entry: the message, DEADLINE_EXCEEDED when none came in time, UNAVAILABLE when the worker
  // closed its end (it ended) first.
  std::map<int, absl::StatusOr<std::string>> ReceiveFromEach(const std::vector<int>& workers,
                                                             absl::Time deadline);

  // Closes the pipes to every worker, waits for them to exit until `deadline`, kills those still
  // running then, and reaps them all. One entry per worker, in order.
  std::vector<WorkerExit> Reap(absl::Time deadline);

 private:
  struct Worker {
    pid_t pid = -1;
    ScopedFd to_worker{-1};
    ScopedFd from_worker{-1};
    std::string received;  // bytes read past the last whole message
    bool reaped = false;
  };
  WorkerProcesses() = default;

  std::vector<Worker> workers_;
};

// Frames `message` (a 4-byte little-endian length, then the bytes), and takes the first whole
// message off the front of `buffer` when there is one. Shared by both ends; exposed for tests.
std::string FrameMessage(absl::string_view message);
bool TakeMessage(std::string& buffer, std::string& message);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_WORKER_PROCESSES_H_
