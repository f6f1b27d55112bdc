#include "common/periodic_thread.h"

#include <utility>

namespace tierd {

PeriodicThread::PeriodicThread(absl::Duration period, std::function<void()> fn)
    : period_(period), fn_(std::move(fn)), thread_([this] { Loop(); }) {}

PeriodicThread::~PeriodicThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void PeriodicThread::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wakes early only to stop.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_);
      if (stopping_) return;
    }
    fn_();
  }
}

}  // namespace tierd
