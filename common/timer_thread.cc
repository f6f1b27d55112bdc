#include "common/timer_thread.h"

#include "absl/time/clock.h"

namespace tierd {

TimerThread::TimerThread() : thread_([this] { Loop(); }) {}

TimerThread::~TimerThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void TimerThread::RunAfter(absl::Duration delay, absl::AnyInvocable<void() &&> fn) {
  absl::MutexLock lock(&mu_);
  pending_.emplace(std::make_pair(absl::Now() + delay, sequence_++), std::move(fn));
}

void TimerThread::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (pending_.empty()) {
      if (stopping_) return;
      mu_.Await(absl::Condition(
          +[](TimerThread* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return self->stopping_ || !self->pending_.empty();
          },
          this));
      continue;
    }
    const absl::Time due = pending_.begin()->first.first;
    if (!stopping_ && absl::Now() < due) {
      // Wakes early when an earlier deadline arrives or the thread stops.
      struct Wake {
        TimerThread* self;
        absl::Time due;
      } wake{this, due};
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](Wake* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  return w->self->stopping_ ||
                                         w->self->pending_.begin()->first.first < w->due;
                                },
                                &wake),
                            due);
      continue;
    }
    absl::AnyInvocable<void() &&> fn = std::move(pending_.begin()->second);
    pending_.erase(pending_.begin());
    mu_.Unlock();
    std::move(fn)();
    mu_.Lock();
  }
}

}  // namespace tierd
