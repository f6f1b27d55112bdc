// Runs a callback every `period` on its own thread until destroyed: the daemon's health checks and
// the metrics' throughput samples.
//
//   PeriodicThread monitor(absl::Seconds(1), [&] { CheckDevice(); });
//
// The first run is one period after construction. A slow callback delays the next run; runs never
// overlap. Thread-safe.
#ifndef TIERD_COMMON_PERIODIC_THREAD_H_
#define TIERD_COMMON_PERIODIC_THREAD_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tierd {

class PeriodicThread {
 public:
  // REQUIRES: period > 0.
  PeriodicThread(absl::Duration period, std::function<void()> fn);
  // Waits for a run in progress to return; no run starts after this begins.
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration period_;
  const std::function<void()> fn_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace tierd

#endif  // TIERD_COMMON_PERIODIC_THREAD_H_
