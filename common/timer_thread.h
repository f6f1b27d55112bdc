// Runs callbacks after a delay (or at once, with a zero delay) on one background thread, one at a
// time: a slow callback delays the rest. Thread-safe.
#ifndef TIERD_COMMON_TIMER_THREAD_H_
#define TIERD_COMMON_TIMER_THREAD_H_

#include <cstdint>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tierd {

class TimerThread {
 public:
  TimerThread();
  // Runs the callbacks still pending at once (in deadline order), then joins.
  ~TimerThread();
  TimerThread(const TimerThread&) = delete;
  TimerThread& operator=(const TimerThread&) = delete;

  void RunAfter(absl::Duration delay, absl::AnyInvocable<void() &&> fn) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  // (deadline, sequence) keeps callbacks with equal deadlines in submission order.
  std::map<std::pair<absl::Time, uint64_t>, absl::AnyInvocable<void() &&>> pending_
      ABSL_GUARDED_BY(mu_);
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tierd

#endif  // TIERD_COMMON_TIMER_THREAD_H_
