// host_cache_test's eviction: FIFO and LRU order, what is never evicted (referenced, pinned or
// still being read), room a device copy's reference will give back, and cancelling a queued
// prefetch.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/storage/host/host_cache_test_fixture.h"

namespace tierd {
namespace host_cache_test {
namespace {

TEST_F(HostCacheTest, FifoEvictsInOrderOfArrival) {
  Start(3, EvictionPolicy::kFifo);
  RegisterModel(4);
  for (int i : {0, 1, 2}) ASSERT_THAT(FetchNow(absl::StrCat("m/blocks.", i)), IsOk());
  ASSERT_THAT(FetchNow("m/blocks.0"), IsOk());  // a hit does not change FIFO order
  ASSERT_THAT(FetchNow("m/blocks.3"), IsOk());
  EXPECT_FALSE(cache_->IsResident("m/blocks.0"));
  EXPECT_TRUE(cache_->IsResident("m/blocks.1"));
  EXPECT_TRUE(cache_->IsResident("m/blocks.2"));
  EXPECT_EQ(cache_->stats().evictions, 1u);
}

TEST_F(HostCacheTest, LruEvictsTheLeastRecentlyUsed) {
  Start(3, EvictionPolicy::kLru);
  RegisterModel(4);
  for (int i : {0, 1, 2}) ASSERT_THAT(FetchNow(absl::StrCat("m/blocks.", i)), IsOk());
  ASSERT_THAT(FetchNow("m/blocks.0"), IsOk());
  ASSERT_THAT(FetchNow("m/blocks.3"), IsOk());
  EXPECT_TRUE(cache_->IsResident("m/blocks.0"));
  EXPECT_FALSE(cache_->IsResident("m/blocks.1"));
}

TEST_F(HostCacheTest, ReferencedAndPinnedObjectsAreNeverEvicted) {
  Start(2);
  RegisterModel(3);
  auto held = FetchNow("m/blocks.0");
  ASSERT_THAT(held, IsOk());
  ASSERT_THAT(FetchNow("m/blocks.1"), IsOk());
  ASSERT_THAT(cache_->Pin("m/blocks.1"), IsOk());
  // Full of a referenced and a pinned object: no room, at once.
  EXPECT_THAT(FetchNow("m/blocks.2"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(cache_->Evict("m/blocks.0"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(HoldsBlock(*held, 0));
  held->Reset();
  auto third = FetchNow("m/blocks.2");
  ASSERT_THAT(third, IsOk());
  EXPECT_TRUE(HoldsBlock(*third, 2));
  EXPECT_FALSE(cache_->IsResident("m/blocks.0"));
  EXPECT_TRUE(cache_->IsResident("m/blocks.1"));
  EXPECT_THAT(cache_->Unpin("m/blocks.1"), IsOk());
  EXPECT_THAT(cache_->Unpin("m/blocks.1"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(HostCacheTest, RoomThatACopysReferenceWillGiveBackIsWaitedForNotRefused) {
  Start(2);
  RegisterModel(3);
  auto copied = FetchNow("m/blocks.0");
  ASSERT_THAT(copied, IsOk());
  auto held = FetchNow("m/blocks.1");
  ASSERT_THAT(held, IsOk());
  // Both referenced, one by a device copy that gives it back on its own once done (its readers may
  // have seen the copy done and asked for more before that): the request waits for it.
  std::shared_ptr<Answer> third = FetchWhileACopyHolds(*copied, "m/blocks.2");
  ASSERT_TRUE(third->ready.HasBeenNotified());
  ASSERT_THAT(third->object, IsOk());
  EXPECT_TRUE(HoldsBlock(*third->object, 2));
  EXPECT_FALSE(cache_->IsResident("m/blocks.0"));
  // No copy holds anything now: full of referenced objects, the cache refuses at once again.
  EXPECT_THAT(FetchNow("m/blocks.0"), StatusIs(absl::StatusCode::kResourceExhausted));

  // A copy's hold that is not the object's last reference frees nothing: the request waiting for
  // it is refused once no copy holds anything, not left waiting.
  auto shared = FetchNow("m/blocks.1");
  ASSERT_THAT(shared, IsOk());
  std::shared_ptr<Answer> fourth = FetchWhileACopyHolds(*shared, "m/blocks.0");
  ASSERT_TRUE(fourth->ready.HasBeenNotified());
  EXPECT_THAT(fourth->object, StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST_F(HostCacheTest, ADiscardedWeightIsReadAgainWhileItsReadersKeepTheOldBytes) {
  Start(4);
  RegisterModel(2);
  auto held = FetchNow("m/blocks.0");
  ASSERT_THAT(held, IsOk());
  ASSERT_THAT(cache_->Pin("m/blocks.0"), IsOk());
  // Referenced and pinned: Evict refuses, Discard does not.
  EXPECT_THAT(cache_->Evict("m/blocks.0"), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(cache_->Discard("m/blocks.0"), IsOk());
  EXPECT_FALSE(cache_->IsResident("m/blocks.0"));
  EXPECT_TRUE(HoldsBlock(*held, 0));
  const uint64_t read_before = cache_->stats().bytes_from_disk;
  auto again = FetchNow("m/blocks.0");
  ASSERT_THAT(again, IsOk());
  EXPECT_NE(again->data(), held->data());  // a copy of its own, read from the file
  EXPECT_TRUE(HoldsBlock(*again, 0));
  EXPECT_GT(cache_->stats().bytes_from_disk, read_before);
  // The pins went with the discarded copy.
  EXPECT_THAT(cache_->Unpin("m/blocks.0"), StatusIs(absl::StatusCode::kFailedPrecondition));
  held->Reset();
  EXPECT_THAT(cache_->Discard("m/blocks.9"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(HostCacheTest, ObjectBeingReadIsNeverEvicted) {
  // Room for one 32 MiB object (and change); one reader thread in small chunks keeps it loading.
  Start(33, EvictionPolicy::kFifo, ReaderOptions(1, 1, 64 * 1024));
  RegisterModel(2, 32 * kMiB);
  // A prefetch holds no reference: only its being in flight protects it.
  ASSERT_THAT(cache_->Prefetch("m/blocks.0", absl::InfiniteFuture()), IsOk());
  EXPECT_THAT(FetchNow("m/blocks.1"), StatusIs(absl::StatusCode::kResourceExhausted));
  const absl::Time deadline = absl::Now() + kTimeout;
  while (!cache_->IsResident("m/blocks.0") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto loaded = FetchNow("m/blocks.0");
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(FirstPatternMismatch(loaded->data(), 32 * kMiB, 0), -1);
  // Once loaded and unreferenced it is an ordinary candidate again.
  loaded->Reset();
  auto second = FetchNow("m/blocks.1");
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(FirstPatternMismatch(second->data(), 32 * kMiB, 1), -1);
  EXPECT_FALSE(cache_->IsResident("m/blocks.0"));
}

TEST_F(HostCacheTest, QueuedPrefetchCanBeCancelled) {
  // One reader thread, small chunks: a large demand read keeps the prefetch queued.
  Start(80, EvictionPolicy::kFifo, ReaderOptions(1, 1, 64 * 1024));
  RegisterModel(2, 32 * kMiB);
  auto big = Fetch("m/blocks.0");
  ASSERT_THAT(cache_->Prefetch("m/blocks.1", absl::InfiniteFuture()), IsOk());
  EXPECT_TRUE(cache_->CancelPrefetch("m/blocks.1"));
  ASSERT_TRUE(big->ready.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(big->object, IsOk());
  EXPECT_FALSE(cache_->IsResident("m/blocks.1"));
  // A cancelled prefetch leaves nothing behind: the object can be fetched normally.
  auto later = FetchNow("m/blocks.1");
  ASSERT_THAT(later, IsOk());
  EXPECT_EQ(FirstPatternMismatch(later->data(), 32 * kMiB, 1), -1);
}

}  // namespace
}  // namespace host_cache_test
}  // namespace tierd
