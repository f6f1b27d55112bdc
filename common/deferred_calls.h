// Calls collected while a lock is held and made once it is released: declare a DeferredCalls
// before the MutexLock, so it is destroyed (and runs the calls, in order) after the lock is gone.
// Keeps callbacks out of critical sections, where they could re-enter and deadlock.
#ifndef TIERD_COMMON_DEFERRED_CALLS_H_
#define TIERD_COMMON_DEFERRED_CALLS_H_

#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"

namespace tierd {

class DeferredCalls {
 public:
  using Calls = std::vector<absl::AnyInvocable<void() &&>>;

  DeferredCalls() = default;
  DeferredCalls(const DeferredCalls&) = delete;
  DeferredCalls& operator=(const DeferredCalls&) = delete;
  ~DeferredCalls() {
    for (auto& call : calls_) std::move(call)();
  }
  Calls& calls() { return calls_; }

 private:
  Calls calls_;
};

// Queues `done(value)` on `calls`, to run once the lock is released.
template <typename Callback, typename Value>
void DeferAnswer(DeferredCalls::Calls& calls, Callback done, Value value) {
  calls.push_back([done = std::move(done), value = std::move(value)]() mutable {
    std::move(done)(std::move(value));
  });
}

}  // namespace tierd

#endif  // TIERD_COMMON_DEFERRED_CALLS_H_
