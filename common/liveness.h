// Lets callbacks that may run after their owner is gone find out. Such a callback holds a
// shared_ptr to a Liveness and runs its work through RunIfAlive; the owner calls MarkGone before
// its parts go, which waits for the calls under way and lets no later one run. The GPU tier's
// device callbacks use it (client drain streams, which a forced close may leave waiting forever on
// CUDA, and streams whose failed copies free their ranges late), and so do the node's host tier's
// answers from homes, which may come after it has stopped.
#ifndef TIERD_COMMON_LIVENESS_H_
#define TIERD_COMMON_LIVENESS_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

class Liveness {
 public:
  Liveness() = default;
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Runs `call` unless MarkGone has run. No lock is held while it runs (a call may make another,
  // on this thread or any other), but MarkGone waits for it. Thread-safe.
  void RunIfAlive(absl::FunctionRef<void()> call) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!alive_) return;
      ++running_;
    }
    call();
    absl::MutexLock lock(&mu_);
    --running_;
  }
  // After this no call runs; returns once the calls under way have returned. Thread-safe.
  // REQUIRES: not called from inside a call (it would wait for itself).
  void MarkGone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    alive_ = false;
    mu_.Await(absl::Condition(
        +[](uint64_t* running) { return *running == 0; }, &running_));
  }

 private:
  absl::Mutex mu_;
  bool alive_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_COMMON_LIVENESS_H_
