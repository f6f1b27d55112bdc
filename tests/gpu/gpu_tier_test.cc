// The GPU tier's facade in-process, on the host device: leases, their sharing and release, LRU
// eviction, waiting for room, stores, quotas and closing a client.
#include "gpu/gpu_tier.h"

#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_tier_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::Answer;
using ::tierd::testing::FetchNow;
using ::tierd::testing::GpuTestStack;
using ::tierd::testing::IsOk;
using ::tierd::testing::kBlockBytes;
using ::tierd::testing::LeaseHoldsBlock;
using ::tierd::testing::StatusIs;
using ::tierd::testing::WaitForCopies;

// Polls `condition` until it holds; false after the answer timeout.
template <typename Condition>
bool Eventually(Condition condition) {
  const absl::Time deadline = absl::Now() + testing::kAnswerTimeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

class GpuTierTest : public ::testing::Test {
 protected:
  // A tier whose staging holds `pool_blocks` blocks, with at most `max_events` events.
  void Start(int pool_blocks, uint32_t max_events = 256) {
    auto stack = GpuTestStack::Create(/*blocks=*/4);
    ASSERT_THAT(stack, IsOk());
    stack_ = *std::move(stack);
    GpuTierOptions options;
    options.pool_bytes = pool_blocks * kBlockBytes;
    options.slab_bytes = kBlockBytes;
    options.max_events = max_events;
    options.copy_chunk_bytes = 16 << 10;
    options.close_grace = absl::Milliseconds(200);
    ASSERT_THAT(stack_->StartTier(options), IsOk());
  }

  GpuTier& tier() { return *stack_->tier; }

  ClientId Open(ClientLimits limits = {}) {
    absl::StatusOr<ClientId> client = tier().OpenClient(limits);
    EXPECT_THAT(client, IsOk());
    return client.value_or(0);
  }

  // Leases block `block` to `client` and checks its bytes.
  LeaseGrant Lease(ClientId client, int block) {
    absl::StatusOr<LeaseGrant> lease = FetchNow(tier(), client, GpuTestStack::BlockKey(block));
    EXPECT_THAT(lease, IsOk());
    if (!lease.ok()) return {};
    EXPECT_TRUE(LeaseHoldsBlock(stack_->device(), tier(), *lease, block));
    return *lease;
  }

  std::unique_ptr<GpuTestStack> stack_;
};

TEST_F(GpuTierTest, FetchLeasesTheObjectsBytesUntilReleased) {
  Start(2);
  const ClientId client = Open();
  const LeaseGrant lease = Lease(client, 0);
  EXPECT_EQ(lease.length, kBlockBytes);
  EXPECT_TRUE(tier().IsOnGpu(GpuTestStack::BlockKey(0)));
  EXPECT_EQ(tier().stats().leases, 1u);
  EXPECT_THAT(tier().Release(client, lease.lease_id), IsOk());
  EXPECT_THAT(tier().Release(client, lease.lease_id),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(tier().Release(client, 99), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(Eventually([&] { return tier().stats().leases == 0; }));
  tier().CloseClient(client);
}

TEST_F(GpuTierTest, ClientsFetchingOneKeyShareOneCopy) {
  Start(2);
  const ClientId first = Open();
  const ClientId second = Open();
  const LeaseGrant a = Lease(first, 1);
  const LeaseGrant b = Lease(second, 1);
  EXPECT_EQ(a.range.slab, b.range.slab);
  EXPECT_EQ(a.range.offset, b.range.offset);
  // One ready event per copy: a lease granted while the copy may still run names it, one granted
  // after it completed names none.
  ASSERT_TRUE(a.ready_event.has_value());
  if (b.ready_event) {
    EXPECT_EQ(a.ready_event, b.ready_event);
  }
  const GpuTierStats stats = tier().stats();
  EXPECT_EQ(stats.objects, 1u);
  EXPECT_EQ(stats.leases, 2u);
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.misses, 1u);
  tier().CloseClient(first);
  tier().CloseClient(second);
}

TEST_F(GpuTierTest, WithNoEventFreeSessionsGetFewerDoneEventsAndCopiesAreAnsweredOnceDone) {
  // Six events: done events may take five of them (three quarters, rounded up), the rest is for
  // copies.
  Start(3, /*max_events=*/6);
  const ClientId full = Open();
  const ClientId short_one = Open();
  const ClientId without = Open();
  EXPECT_EQ(tier().DoneEvents(full).size(), 4u);
  EXPECT_EQ(tier().DoneEvents(short_one).size(), 1u);
  EXPECT_TRUE(tier().DoneEvents(without).empty());
  EXPECT_EQ(tier().event_stats().shortfalls, 2u);

  // The one event for copies is the first copy's, until its lease is released.
  const LeaseGrant first = Lease(full, 0);
  EXPECT_TRUE(first.ready_event.has_value());
  // No event is left for the next copy's ready event: the fetch is answered once the copy is
  // done, with the bytes in place and nothing to wait for.
  const LeaseGrant lease = Lease(without, 1);
  EXPECT_FALSE(lease.ready_event.has_value());
  EXPECT_EQ(tier().event_stats().shortfalls, 3u);
  EXPECT_EQ(tier().event_stats().in_use, 6u);
  // A release names one of the session's own done events, or none.
  EXPECT_THAT(tier().Release(without, lease.lease_id, tier().DoneEvents(full).front()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(tier().Release(without, lease.lease_id), IsOk());
  EXPECT_TRUE(Eventually([&] { return tier().stats().leases == 1; }));

  // A closed session's done event comes back, but as a done event only: clients may still hold
  // its handle and record it, so it never becomes a copy's ready event, which readers trust.
  tier().CloseClient(short_one);
  EXPECT_TRUE(Eventually([&] { return tier().event_stats().in_use == 5; }));
  const LeaseGrant later = Lease(without, 2);
  EXPECT_FALSE(later.ready_event.has_value());
  EXPECT_EQ(tier().event_stats().shortfalls, 4u);
  const ClientId reopened = Open();
  EXPECT_EQ(tier().DoneEvents(reopened).size(), 1u);

  for (ClientId client : {full, without, reopened}) tier().CloseClient(client);
  // The closed sessions' done events come back once they have completed.
  EXPECT_TRUE(Eventually([&] { return tier().event_stats().in_use == 0; }));
}

TEST_F(GpuTierTest, LeastRecentlyUsedObjectIsEvictedFirst) {
  Start(2);
  const ClientId client = Open();
  for (int block : {0, 1, 0}) {
    const LeaseGrant lease = Lease(client, block);
    ASSERT_THAT(tier().Release(client, lease.lease_id), IsOk());
  }
  ASSERT_TRUE(Eventually([&] { return tier().stats().leases == 0; }));
  ASSERT_TRUE(WaitForCopies(tier()));
  Lease(client, 2);  // room for it: block 1, used longest ago, goes
  EXPECT_TRUE(tier().IsOnGpu(GpuTestStack::BlockKey(0)));
  EXPECT_FALSE(tier().IsOnGpu(GpuTestStack::BlockKey(1)));
  EXPECT_TRUE(tier().IsOnGpu(GpuTestStack::BlockKey(2)));
  EXPECT_EQ(tier().stats().evictions, 1u);
  tier().CloseClient(client);
}

TEST_F(GpuTierTest, FullPoolWithNothingToFreeIsRefusedAtOnce) {
  Start(1);
  const ClientId client = Open();
  Lease(client, 0);
  ASSERT_TRUE(WaitForCopies(tier()));
  EXPECT_THAT(FetchNow(tier(), client, GpuTestStack::BlockKey(1)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  tier().CloseClient(client);
}

TEST_F(GpuTierTest, FetchWaitsForRoomThatAReleaseFrees) {
  Start(1);
  const ClientId client = Open();
  const LeaseGrant held = Lease(client, 0);
  ASSERT_TRUE(WaitForCopies(tier()));
  // The client's last use of the buffer is still running: its done event completes only once
  // `reading` is notified.
  auto stream = stack_->device().CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stream, IsOk());
  absl::Notification reading;
  ASSERT_THAT(
      stack_->device().LaunchHostFunction(**stream, [&reading] { reading.WaitForNotification(); }),
      IsOk());
  const uint32_t done = tier().DoneEvents(client).front();
  ASSERT_THAT(stack_->device().RecordEvent(tier().events().event(done), **stream), IsOk());
  ASSERT_THAT(tier().Release(client, held.lease_id, done), IsOk());

  Answer<absl::StatusOr<LeaseGrant>> waiting;
  tier().Fetch(client, GpuTestStack::BlockKey(1), ReadPriority::kDemand, absl::InfiniteFuture(),
               waiting.Callback());
  ASSERT_TRUE(Eventually([&] { return tier().stats().allocation_waiters == 1; }));
  EXPECT_FALSE(waiting.ready.HasBeenNotified());
  reading.Notify();
  absl::StatusOr<LeaseGrant> lease = waiting.Wait();
  ASSERT_THAT(lease, IsOk());
  EXPECT_TRUE(LeaseHoldsBlock(stack_->device(), tier(), *lease, 1));
  EXPECT_FALSE(tier().IsOnGpu(GpuTestStack::BlockKey(0)));
  ASSERT_THAT(stack_->device().SynchronizeStream(**stream), IsOk());
  tier().CloseClient(client);
}

TEST_F(GpuTierTest, CommittedObjectIsPublishedThenFetchedFromEitherTier) {
  Start(2);
  const ClientId writer = Open();
  Answer<absl::StatusOr<ReservationGrant>> reserved;
  tier().Reserve(writer, "s/obj", kBlockBytes, {}, StorePolicy{}, reserved.Callback());
  absl::StatusOr<ReservationGrant> reservation = reserved.Wait();
  ASSERT_THAT(reservation, IsOk());
  testing::FillPattern(tier().pool().data(reservation->range), kBlockBytes, 77);
  Answer<absl::Status> committed;
  tier().Commit(writer, reservation->reservation_id, /*abort=*/false, std::nullopt,
                committed.Callback());
  ASSERT_THAT(committed.Wait(), IsOk());
  EXPECT_TRUE(tier().IsOnGpu("s/obj"));

  const ClientId reader = Open();
  auto check = [&] {
    absl::StatusOr<LeaseGrant> lease = FetchNow(tier(), reader, "s/obj");
    ASSERT_THAT(lease, IsOk());
    if (lease->ready_event) {
      ASSERT_THAT(stack_->device().SynchronizeEvent(tier().events().event(*lease->ready_event)),
                  IsOk());
    }
    EXPECT_EQ(testing::FirstPatternMismatch(tier().pool().data(lease->range), kBlockBytes, 77), -1);
    ASSERT_THAT(tier().Release(reader, lease->lease_id), IsOk());
  };
  {
    // The writer's bytes were in staging before the commit published them: nothing to wait for.
    absl::StatusOr<LeaseGrant> lease = FetchNow(tier(), reader, "s/obj");
    ASSERT_THAT(lease, IsOk());
    EXPECT_FALSE(lease->ready_event.has_value());
    ASSERT_THAT(tier().Release(reader, lease->lease_id), IsOk());
  }
  check();  // from staging
  ASSERT_TRUE(Eventually([&] { return tier().stats().leases == 0; }));
  ASSERT_THAT(tier().Evict("s/obj", EvictTier::kGpu), IsOk());
  EXPECT_FALSE(tier().IsOnGpu("s/obj"));
  check();  // from the host tier
  EXPECT_EQ(tier().stats().bytes_gpu_to_host, kBlockBytes);
  tier().CloseClient(writer);
  tier().CloseClient(reader);
}

TEST_F(GpuTierTest, QuotasAreEnforcedPerClient) {
  Start(2);
  ClientLimits one_lease;
  one_lease.max_leases = 1;
  const ClientId limited = Open(one_lease);
  const ClientId other = Open();
  Lease(limited, 0);
  EXPECT_THAT(FetchNow(tier(), limited, GpuTestStack::BlockKey(1)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  Lease(other, 1);

  ClientLimits one_block;
  one_block.max_staging_bytes = kBlockBytes;
  const ClientId small = Open(one_block);
  Answer<absl::Status> pinned;
  tier().Pin(small, GpuTestStack::BlockKey(0), pinned.Callback());
  ASSERT_THAT(pinned.Wait(), IsOk());
  EXPECT_THAT(FetchNow(tier(), small, GpuTestStack::BlockKey(1)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_THAT(tier().Unpin(small, GpuTestStack::BlockKey(0)), IsOk());
  EXPECT_THAT(tier().Unpin(small, GpuTestStack::BlockKey(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  Lease(small, 1);
  for (ClientId client : {limited, other, small}) tier().CloseClient(client);
}

TEST_F(GpuTierTest, ClosingAClientReleasesWhatItHeld) {
  Start(3);
  const ClientId client = Open();
  Lease(client, 0);
  Answer<absl::Status> pinned;
  tier().Pin(client, GpuTestStack::BlockKey(1), pinned.Callback());
  ASSERT_THAT(pinned.Wait(), IsOk());
  Answer<absl::StatusOr<ReservationGrant>> reserved;
  tier().Reserve(client, "s/unfinished", kBlockBytes, {}, StorePolicy{}, reserved.Callback());
  ASSERT_THAT(reserved.Wait(), IsOk());

  const ClosedClient closed = tier().CloseClient(client);
  EXPECT_EQ(closed.leases, 1u);
  EXPECT_EQ(closed.reservations, 1u);
  EXPECT_EQ(closed.pins, 1u);
  EXPECT_THAT(FetchNow(tier(), client, GpuTestStack::BlockKey(0)),
              StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_TRUE(Eventually([&] {
    const GpuTierStats stats = tier().stats();
    return stats.leases == 0 && stats.pins == 0 && stats.reservations == 0 && stats.clients == 0;
  }));
  // Everything it held may be evicted now: another client gets the whole pool.
  const ClientId next = Open();
  for (int block : {2, 3}) Lease(next, block);
  EXPECT_FALSE(tier().device_may_never_idle());
  tier().CloseClient(next);
}

TEST_F(GpuTierTest, IdleObjectOfADroppedModelIsFreedWhenItIsNextAskedFor) {
  Start(2);
  const ClientId client = Open();
  const LeaseGrant lease = Lease(client, 0);
  ASSERT_THAT(tier().Release(client, lease.lease_id), IsOk());
  ASSERT_TRUE(Eventually([&] { return tier().stats().leases == 0; }));
  ASSERT_TRUE(WaitForCopies(tier()));
  EXPECT_EQ(tier().stats().used_bytes, kBlockBytes);
  // The registration its bytes belong to goes: the next fetch finds the object stale, unlists it
  // and, since nothing holds it, gives its staging back.
  ASSERT_THAT(stack_->catalog().DropModel("m"), IsOk());
  EXPECT_THAT(FetchNow(tier(), client, GpuTestStack::BlockKey(0)),
              StatusIs(absl::StatusCode::kNotFound));
  const GpuTierStats stats = tier().stats();
  EXPECT_EQ(stats.objects, 0u);
  EXPECT_EQ(stats.used_bytes, 0u);
  tier().CloseClient(client);
}

}  // namespace
}  // namespace tierd
