// Lets device callbacks that may run after the GPU tier is gone find out: client drain streams,
// which a forced close may leave waiting forever on CUDA, and streams whose failed copies free
// their ranges late. Such a callback holds a shared_ptr to this and runs its work through
// RunIfAlive; the tier calls MarkGone before its parts go. Internal to the GPU tier.
#ifndef TIERD_GPU_DETAIL_LIVENESS_H_
#define TIERD_GPU_DETAIL_LIVENESS_H_

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

class Liveness {
 public:
  Liveness() = default;
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Runs `call` unless MarkGone has run. The lock is held while it runs, so MarkGone waits for a
  // call under way. Thread-safe.
  void RunIfAlive(absl::FunctionRef<void()> call) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (alive_) call();
  }
  // After this no call runs. Thread-safe.
  void MarkGone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    alive_ = false;
  }

 private:
  absl::Mutex mu_;
  bool alive_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_LIVENESS_H_
