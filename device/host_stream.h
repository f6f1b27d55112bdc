// A HostDevice stream: one worker thread running enqueued tasks (copies, event records and waits,
// host functions) strictly in order.
#ifndef TIERD_DEVICE_HOST_STREAM_H_
#define TIERD_DEVICE_HOST_STREAM_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"
#include "device/shared_event.h"

namespace tierd {

class HostStream final : public Stream {
 public:
  // Starts the stream's thread. RESOURCE_EXHAUSTED when the system will not start one more (a
  // pids or tasks limit, RLIMIT_NPROC, or no address space for its stack): the caller refuses what
  // needed the stream, and the process goes on.
  static absl::StatusOr<std::unique_ptr<HostStream>> Create();
  // Runs the work already enqueued, then joins. A wait on an event that will never complete (its
  // recording process died) is abandoned, so destruction cannot hang.
  ~HostStream() override;

  void Enqueue(absl::AnyInvocable<void() &&> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Enqueues a wait for record `n` of `event`; `keepalive` owns the memory `event` lives in.
  void EnqueueWait(std::shared_ptr<const void> keepalive, SharedEvent* event, uint64_t n)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until every task enqueued before the call has run.
  void Synchronize() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether every task enqueued before the call has run.
  bool Idle() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  HostStream() = default;
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> abandon_waits_{false};
  std::thread worker_;
};

}  // namespace tierd

#endif  // TIERD_DEVICE_HOST_STREAM_H_
