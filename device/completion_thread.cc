#include "device/completion_thread.h"

#include <utility>

namespace tierd {

CompletionThread::CompletionThread() : thread_([this] { Run(); }) {}

CompletionThread::~CompletionThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void CompletionThread::Post(absl::AnyInvocable<void() &&> callback) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(callback));
}

void CompletionThread::Run() {
  for (;;) {
    absl::AnyInvocable<void() &&> callback;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CompletionThread* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, and everything posted has run
      callback = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(callback)();
  }
}

}  // namespace tierd
