// The one queue under every reader (storage/io/detail/read_queue.h): demand before prefetch, then
// the earliest deadline, then first come; a request taken out or moved keeps the others' order.
#include "storage/io/detail/read_queue.h"

#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tierd {
namespace {

using ::testing::ElementsAre;

TEST(ReadQueueTest, DemandFirstThenTheEarliestDeadlineThenFirstCome) {
  const absl::Time now = absl::Now();
  ReadQueue queue;
  EXPECT_FALSE(queue.Front().has_value());
  queue.Push(1, ReadPriority::kPrefetch, absl::InfiniteFuture());
  queue.Push(2, ReadPriority::kPrefetch, now + absl::Seconds(2));
  queue.Push(3, ReadPriority::kDemand, absl::InfiniteFuture());
  queue.Push(4, ReadPriority::kPrefetch, now + absl::Seconds(1));
  queue.Push(5, ReadPriority::kDemand, absl::InfiniteFuture());
  queue.Push(6, ReadPriority::kPrefetch, now + absl::Seconds(1));
  EXPECT_EQ(queue.size(), 6u);
  EXPECT_EQ(queue.Front(), 3u);
  EXPECT_THAT(queue.TakeAll(), ElementsAre(3, 5, 4, 6, 2, 1));
  EXPECT_TRUE(queue.empty());
}

TEST(ReadQueueTest, RemovedAndMovedRequestsLeaveTheOthersInOrder) {
  const absl::Time now = absl::Now();
  ReadQueue queue;
  for (ReadQueue::Id id = 1; id <= 4; ++id) {
    queue.Push(id, ReadPriority::kPrefetch, now + absl::Seconds(id));
  }
  EXPECT_TRUE(queue.Remove(2));
  EXPECT_FALSE(queue.Remove(2));
  EXPECT_FALSE(queue.Contains(2));
  EXPECT_TRUE(queue.Reprioritize(4, ReadPriority::kDemand, absl::InfiniteFuture()));
  EXPECT_FALSE(queue.Reprioritize(9, ReadPriority::kDemand, absl::InfiniteFuture()));
  EXPECT_EQ(queue.Front(), 4u);
  // A later deadline moves it back behind one that came after it.
  EXPECT_TRUE(queue.Reprioritize(4, ReadPriority::kPrefetch, now + absl::Seconds(10)));
  EXPECT_TRUE(queue.Reprioritize(1, ReadPriority::kPrefetch, now + absl::Seconds(20)));
  EXPECT_THAT(queue.TakeAll(), ElementsAre(3, 4, 1));
}

}  // namespace
}  // namespace tierd
