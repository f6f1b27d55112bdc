// A fixed set of threads that run the jobs posted to them: urgent ones first, then the others,
// each kind first posted first started. For work that must not hold up the thread that produced it
// (the host cache hashes each object read from disk here, so that the reader threads go on
// reading, and a demand read's object before prefetched ones).
//
//   WorkerPool hashers(4);
//   hashers.Post([entry] { Verify(entry); }, WorkerPool::kUrgent);
//
// At most `threads` jobs run at once. The queue is not bounded: callers bound what they post (the
// host cache posts at most one job per read in flight). Thread-safe.
#ifndef TIERD_COMMON_WORKER_POOL_H_
#define TIERD_COMMON_WORKER_POOL_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

class WorkerPool {
 public:
  // REQUIRES: threads >= 1.
  explicit WorkerPool(int threads);
  // Runs every job already posted, then joins the threads. REQUIRES: nothing posts meanwhile.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  enum Urgency { kNormal, kUrgent };
  void Post(absl::AnyInvocable<void() &&> job, Urgency urgency = kNormal)
      ABSL_LOCKS_EXCLUDED(mu_);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> urgent_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::AnyInvocable<void() &&>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // last: started once the rest is built
};

}  // namespace tierd

#endif  // TIERD_COMMON_WORKER_POOL_H_
