// WorkerPool: every job posted runs once, no more than the pool's threads at a time, and the
// destructor runs what is still queued before it joins.
#include "common/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tierd {
namespace {

TEST(WorkerPoolTest, RunsEveryJobOnceAndNoMoreAtOnceThanItsThreads) {
  constexpr int kThreads = 3;
  constexpr int kJobs = 60;
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::atomic<int> ran{0};
  {
    WorkerPool pool(kThreads);
    EXPECT_EQ(pool.threads(), kThreads);
    for (int i = 0; i < kJobs; ++i) {
      pool.Post([&] {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        absl::SleepFor(absl::Microseconds(200));
        --running;
        ++ran;
      });
    }
  }  // the destructor runs what is queued
  EXPECT_EQ(ran.load(), kJobs);
  EXPECT_LE(most.load(), kThreads);
  EXPECT_GE(most.load(), 2);  // the jobs did run side by side
}

TEST(WorkerPoolTest, AJobRunsWhileAnotherBlocks) {
  WorkerPool pool(2);
  absl::Notification release;
  absl::Notification second_ran;
  pool.Post([&] { release.WaitForNotification(); });
  pool.Post([&] { second_ran.Notify(); });
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  release.Notify();
}

TEST(WorkerPoolTest, UrgentJobsGoBeforeTheOthersQueued) {
  WorkerPool pool(1);
  absl::Notification release;
  pool.Post([&] { release.WaitForNotification(); });  // holds the one thread
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification all_ran;
  auto record = [&](int job) {
    return [&, job] {
      absl::MutexLock lock(&mu);
      order.push_back(job);
      if (order.size() == 4) all_ran.Notify();
    };
  };
  pool.Post(record(1));
  pool.Post(record(2));
  pool.Post(record(3), WorkerPool::kUrgent);
  pool.Post(record(4), WorkerPool::kUrgent);
  release.Notify();
  ASSERT_TRUE(all_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{3, 4, 1, 2}));
}

}  // namespace
}  // namespace tierd
