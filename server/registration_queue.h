// Where model registrations run, and how many at once: a registration reads a model's headers
// (from disk, or from an object store that may be slow or silent) and builds its description,
// which for a request of many derived tensors takes many times the request's bytes. So:
//
//   - local registrations run on a thread of their own, remote ones on `remote_threads` others,
//     and drops on the service's admin thread: none waits behind a slow store;
//   - at most max_admitted registrations are queued or running: the next is refused at once
//     (RESOURCE_EXHAUSTED), before its request is parsed;
//   - each running registration first takes its estimated memory from a budget shared by all
//     (a larger one runs alone), waiting — and giving up when its caller goes — while others
//     hold it.
//
// Thread-safe.
#ifndef TIERD_SERVER_REGISTRATION_QUEUE_H_
#define TIERD_SERVER_REGISTRATION_QUEUE_H_

#include <atomic>
#include <cstdint>

#include "absl/functional/any_invocable.h"
#include "common/byte_budget.h"
#include "common/worker_pool.h"

namespace tierd {

struct RegistrationQueueOptions {
  int max_admitted = 8;
  int remote_threads = 2;
  uint64_t memory_bytes = 256ull << 20;
};

class RegistrationQueue {
 public:
  explicit RegistrationQueue(const RegistrationQueueOptions& options = {});
  // Runs what is queued (each sees shutting_down() and answers at once), then joins.
  ~RegistrationQueue() = default;
  RegistrationQueue(const RegistrationQueue&) = delete;
  RegistrationQueue& operator=(const RegistrationQueue&) = delete;

  // A place for one more registration; false when max_admitted hold one. Each true is matched by
  // one Leave.
  bool Admit();
  void Leave();
  // Runs an admitted registration on the remote or the local workers.
  void Post(bool remote, absl::AnyInvocable<void() &&> job);

  // The memory a running registration takes: Acquire before its work, Release after.
  ByteBudget& memory() { return memory_; }
  // What a registration of a request of `request_bytes` may take at its peak.
  static uint64_t EstimatedBytes(uint64_t request_bytes, bool remote);

  void StartShutdown() { shutting_down_ = true; }
  bool shutting_down() const { return shutting_down_.load(); }
  int admitted() const { return admitted_.load(); }
  int max_admitted() const { return max_admitted_; }

 private:
  const int max_admitted_;
  std::atomic<int> admitted_{0};
  std::atomic<bool> shutting_down_{false};
  ByteBudget memory_;
  // Last: joined first, while the rest is still there.
  WorkerPool local_;
  WorkerPool remote_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_REGISTRATION_QUEUE_H_
