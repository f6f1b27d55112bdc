// Counts the callbacks into the GPU tier that are running, so that its destructor can wait for
// them. Internal to the GPU tier; the counter is guarded by the tier's lock.
#ifndef TIERD_GPU_DETAIL_RUNNING_CALLBACKS_H_
#define TIERD_GPU_DETAIL_RUNNING_CALLBACKS_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

class RunningCallbacks {
 public:
  // `tier_mu` is the GPU tier's lock; it must outlive this.
  explicit RunningCallbacks(absl::Mutex& tier_mu) : mu_(tier_mu) {}
  RunningCallbacks(const RunningCallbacks&) = delete;
  RunningCallbacks& operator=(const RunningCallbacks&) = delete;

  // Marks a callback into the tier (a host or peer fetch answered, a host reservation, a copy
  // done) as running, from before it counts itself out of its in-flight count until after the
  // calls it deferred past the lock have run: those use the tier and its objects too, so the
  // destructor waits for callbacks_running_ as well. Declared before the callback's DeferredCalls.
  class Scope {
   public:
    explicit Scope(RunningCallbacks& callbacks) : callbacks_(callbacks) {
      absl::MutexLock lock(&callbacks_.mu_);
      ++callbacks_.callbacks_running_;
    }
    ~Scope() {
      absl::MutexLock lock(&callbacks_.mu_);
      --callbacks_.callbacks_running_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    RunningCallbacks& callbacks_;
  };

  // REQUIRES: the tier's lock is held.
  bool none() const {
    mu_.AssertHeld();
    return callbacks_running_ == 0;
  }

 private:
  absl::Mutex& mu_;
  uint64_t callbacks_running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_RUNNING_CALLBACKS_H_
