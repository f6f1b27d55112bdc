// A single thread that runs completion callbacks one at a time, in the order they were posted.
// Backends post to it from stream threads (host) or driver threads (CUDA), which must not run user
// code themselves: CUDA forbids device calls from its host-function threads, and a slow callback
// must not hold up a stream.
#ifndef TIERD_DEVICE_COMPLETION_THREAD_H_
#define TIERD_DEVICE_COMPLETION_THREAD_H_

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

class CompletionThread {
 public:
  CompletionThread();
  // Runs every callback posted before destruction, then joins.
  ~CompletionThread();
  CompletionThread(const CompletionThread&) = delete;
  CompletionThread& operator=(const CompletionThread&) = delete;

  // Thread-safe; never blocks on callbacks.
  void Post(absl::AnyInvocable<void() &&> callback) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tierd

#endif  // TIERD_DEVICE_COMPLETION_THREAD_H_
