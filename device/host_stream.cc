#include "device/host_stream.h"

#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tierd {
namespace {

// Waits sleep in slices this long so that a stream being destroyed notices it.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(100);

}  // namespace

absl::StatusOr<std::unique_ptr<HostStream>> HostStream::Create() {
  std::unique_ptr<HostStream> stream(new HostStream());
  try {
    stream->worker_ = std::thread([raw = stream.get()] { raw->Run(); });
  } catch (const std::system_error& error) {
    // The one place a thread's failure to start is an answer rather than the process's end: a
    // stream is made per session, and sessions come from clients.
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the thread of a host stream: ", error.what()));
  }
  return stream;
}

HostStream::~HostStream() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  abandon_waits_.store(true);
  if (worker_.joinable()) worker_.join();
}

void HostStream::Enqueue(absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  ++enqueued_;
}

void HostStream::EnqueueWait(std::shared_ptr<const void> keepalive, SharedEvent* event,
                             uint64_t n) {
  Enqueue([this, keepalive = std::move(keepalive), event, n] {
    while (!event->WaitFor(n, kWaitSlice)) {
      if (abandon_waits_.load()) {
        TIERD_LOG(WARNING) << "stream destroyed while waiting on an event that never completed";
        return;
      }
    }
  });
}

void HostStream::Synchronize() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = enqueued_;
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ >= target; };
  mu_.Await(absl::Condition(&done));
}

bool HostStream::Idle() {
  absl::MutexLock lock(&mu_);
  return finished_ >= enqueued_;
}

void HostStream::Run() {
  for (;;) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
    absl::MutexLock lock(&mu_);
    ++finished_;
  }
}

}  // namespace tierd
