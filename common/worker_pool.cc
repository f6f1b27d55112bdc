#include "common/worker_pool.h"

#include <utility>

namespace tierd {

WorkerPool::WorkerPool(int threads) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void WorkerPool::Post(absl::AnyInvocable<void() &&> job, Urgency urgency) {
  absl::MutexLock lock(&mu_);
  (urgency == kUrgent ? urgent_ : jobs_).push_back(std::move(job));
}

void WorkerPool::Loop() {
  for (;;) {
    absl::AnyInvocable<void() &&> job;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !urgent_.empty() || !jobs_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&has_work));
      std::deque<absl::AnyInvocable<void() &&>>& queue = urgent_.empty() ? jobs_ : urgent_;
      if (queue.empty()) return;  // stopping, and nothing is left to run
      job = std::move(queue.front());
      queue.pop_front();
    }
    std::move(job)();
  }
}

}  // namespace tierd
