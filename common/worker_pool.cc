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

void WorkerPool::Post(absl::AnyInvocable<void() &&> job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

void WorkerPool::Loop() {
  for (;;) {
    absl::AnyInvocable<void() &&> job;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !jobs_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&has_work));
      if (jobs_.empty()) return;  // stopping, and nothing is left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    std::move(job)();
  }
}

}  // namespace tierd
