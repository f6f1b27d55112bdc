// CommitPipeline on its own (with the drain queue it completes through, and a host cache from the
// GPU test stack): a commit copies out only once the client's written event has completed, is
// published and then in the host tier with the bytes written; an aborted reservation frees its
// range; a commit the host tier refuses leaves the key's previous version.
#include "gpu/detail/commit_pipeline.h"

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_parts_test_support.h"
#include "tests/gpu_tier_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::Answer;
using ::tierd::testing::FillPattern;
using ::tierd::testing::FirstPatternMismatch;
using ::tierd::testing::GpuParts;
using ::tierd::testing::GpuPartsOptions;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

constexpr uint64_t kObjectBytes = 64 << 10;
// One slab that also holds an object larger than the stack's 4 MiB host arena.
constexpr uint64_t kPoolBytes = 8 << 20;
constexpr absl::Duration kBound = absl::Seconds(10);
// How long a commit that must not be answered yet is given to be answered anyway.
constexpr absl::Duration kNotYet = absl::Milliseconds(100);

class CommitPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GpuPartsOptions options;
    options.pool_bytes = kPoolBytes;
    options.slab_bytes = kPoolBytes;
    auto parts = GpuParts::Create(options);
    ASSERT_THAT(parts, IsOk());
    parts_ = *std::move(parts);
    store_stream_ = parts_->NewStream();
    client_stream_ = parts_->NewStream();
    ASSERT_NE(store_stream_, nullptr);
    ASSERT_NE(client_stream_, nullptr);
    commits_ = std::make_unique<CommitPipeline>(
        parts_->tier(), CommitPipeline::Own{parts_->host_cache(), /*durable_store=*/nullptr,
                                            *store_stream_, parts_->clients(), parts_->drains(),
                                            parts_->stored()});
    absl::StatusOr<uint32_t> done_event = parts_->events().Acquire(EventUse::kClientRecords);
    ASSERT_THAT(done_event, IsOk());
    done_event_ = *done_event;
    absl::StatusOr<ClientId> client = parts_->clients().Open({}, {done_event_});
    ASSERT_THAT(client, IsOk());
    client_ = *client;
  }

  void TearDown() override {
    LetTheClientGo();
    if (client_stream_ != nullptr) {
      EXPECT_THAT(parts_->device().SynchronizeStream(*client_stream_), IsOk());
    }
    // As the tier does before its parts go: no commit or callback is left under way.
    if (commits_ != nullptr) {
      EXPECT_TRUE(parts_->AwaitQuiet([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return commits_->idle();
      }));
    }
    commits_.reset();
    parts_.reset();
  }

  absl::StatusOr<ReservationGrant> Reserve(const std::string& key, uint64_t length) {
    Answer<absl::StatusOr<ReservationGrant>> reserved;
    commits_->Reserve(client_, key, length, {}, StorePolicy{}, reserved.Callback());
    return reserved.Wait();
  }

  // The client's write of `length` bytes of pattern `seed` into the reservation, on its stream,
  // then the record of its done event. With `held_back`, neither runs until LetTheClientGo.
  void Write(const ReservationGrant& grant, uint64_t seed, bool held_back) {
    Device& device = parts_->device();
    uint8_t* staging = parts_->pool().data(grant.range);
    ASSERT_THAT(device.LaunchHostFunction(*client_stream_,
                                          [this, staging, length = grant.length, seed, held_back] {
                                            if (held_back)
                                              go_.WaitForNotificationWithTimeout(kBound);
                                            FillPattern(staging, length, seed);
                                          }),
                IsOk());
    ASSERT_THAT(device.RecordEvent(parts_->events().event(done_event_), *client_stream_), IsOk());
  }

  void LetTheClientGo() {
    if (!go_.HasBeenNotified()) go_.Notify();
  }

  // Whether the host tier holds `key` with `length` bytes of pattern `seed`.
  bool HostHolds(const std::string& key, uint64_t length, uint64_t seed) {
    Answer<absl::StatusOr<HostObject>> fetched;
    parts_->host_cache().Fetch(key, ReadPriority::kDemand, absl::InfiniteFuture(),
                               fetched.Callback());
    absl::StatusOr<HostObject> object = fetched.Wait();
    EXPECT_THAT(object, IsOk());
    return object.ok() && object->size() == length &&
           FirstPatternMismatch(object->data(), length, seed) < 0;
  }

  // Commits reservation `grant` (written already) and waits for the answer.
  absl::Status CommitNow(const ReservationGrant& grant) {
    Answer<absl::Status> committed;
    commits_->Commit(client_, grant.reservation_id, /*abort=*/false, done_event_,
                     committed.Callback());
    return committed.Wait();
  }

  // Waits (bounded) until the staging pool has `bytes` in use.
  bool AwaitPoolUse(uint64_t bytes) {
    const absl::Time deadline = absl::Now() + kBound;
    while (parts_->pool().used_bytes() != bytes) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }

  std::unique_ptr<GpuParts> parts_;
  Stream* store_stream_ = nullptr;
  Stream* client_stream_ = nullptr;
  std::unique_ptr<CommitPipeline> commits_;
  absl::Notification go_;
  ClientId client_ = 0;
  uint32_t done_event_ = 0;  // the client's one done event
};

TEST_F(CommitPipelineTest, CopiesOutOnlyOnceTheClientsWrittenEventHasCompleted) {
  absl::StatusOr<ReservationGrant> grant = Reserve("s/obj", kObjectBytes);
  ASSERT_THAT(grant, IsOk());
  Write(*grant, /*seed=*/7, /*held_back=*/true);
  Answer<absl::Status> committed;
  commits_->Commit(client_, grant->reservation_id, /*abort=*/false, done_event_,
                   committed.Callback());
  EXPECT_FALSE(committed.ready.WaitForNotificationWithTimeout(kNotYet));
  EXPECT_FALSE(parts_->stored().Contains("s/obj"));
  EXPECT_FALSE(parts_->host_cache().IsResident("s/obj"));
  {
    absl::MutexLock lock(&parts_->mu);
    EXPECT_EQ(parts_->residency().FindListed("s/obj"), nullptr);  // not published before the copy
    EXPECT_FALSE(commits_->idle());
  }
  LetTheClientGo();
  EXPECT_THAT(committed.Wait(), IsOk());
  // Copied after the write, not before: the host tier has the bytes written.
  EXPECT_TRUE(HostHolds("s/obj", kObjectBytes, /*seed=*/7));
}

TEST_F(CommitPipelineTest, ACommittedObjectIsPublishedAndThenInTheHostTier) {
  absl::StatusOr<ReservationGrant> grant = Reserve("s/obj", kObjectBytes);
  ASSERT_THAT(grant, IsOk());
  {
    absl::MutexLock lock(&parts_->mu);
    EXPECT_EQ(parts_->stats.reservations, 1u);
    EXPECT_EQ(parts_->clients().Find(client_)->staging_bytes, kObjectBytes);
  }
  Write(*grant, /*seed=*/11, /*held_back=*/false);
  ASSERT_THAT(CommitNow(*grant), IsOk());
  ASSERT_TRUE(parts_->stored().Find("s/obj").has_value());
  EXPECT_EQ(parts_->stored().Find("s/obj")->size, kObjectBytes);
  EXPECT_TRUE(parts_->host_cache().IsResident("s/obj"));
  EXPECT_TRUE(HostHolds("s/obj", kObjectBytes, /*seed=*/11));
  absl::MutexLock lock(&parts_->mu);
  // The staging copy stays listed and resident, with the bytes written.
  StagingObject* object = parts_->residency().FindListed("s/obj");
  ASSERT_NE(object, nullptr);
  EXPECT_EQ(object->state, StagingObject::State::kResident);
  EXPECT_FALSE(object->copying);
  ASSERT_TRUE(object->memory.has_value());
  EXPECT_LT(FirstPatternMismatch(parts_->pool().data(object->memory->range()), kObjectBytes, 11), 0);
  EXPECT_EQ(parts_->stats.reservations, 0u);
  EXPECT_EQ(parts_->stats.bytes_gpu_to_host, kObjectBytes);
  EXPECT_EQ(parts_->clients().Find(client_)->staging_bytes, 0u);
  EXPECT_TRUE(commits_->idle());
}

TEST_F(CommitPipelineTest, AnAbortedReservationFreesItsRangeOnceWritten) {
  absl::StatusOr<ReservationGrant> grant = Reserve("s/obj", kObjectBytes);
  ASSERT_THAT(grant, IsOk());
  const uint64_t reserved = parts_->pool().used_bytes();
  EXPECT_GE(reserved, kObjectBytes);
  Write(*grant, /*seed=*/3, /*held_back=*/true);
  Answer<absl::Status> aborted;
  commits_->Commit(client_, grant->reservation_id, /*abort=*/true, done_event_, aborted.Callback());
  EXPECT_THAT(aborted.Wait(), IsOk());
  // The client's stream may still write the range: it is kept until the written event completes.
  absl::SleepFor(kNotYet);
  EXPECT_EQ(parts_->pool().used_bytes(), reserved);
  LetTheClientGo();
  EXPECT_TRUE(AwaitPoolUse(0));
  EXPECT_FALSE(parts_->stored().Contains("s/obj"));
  EXPECT_FALSE(parts_->host_cache().IsResident("s/obj"));
  {
    absl::MutexLock lock(&parts_->mu);
    EXPECT_EQ(parts_->stats.reservations, 0u);
    EXPECT_EQ(parts_->clients().Find(client_)->staging_bytes, 0u);
    EXPECT_EQ(parts_->residency().FindListed("s/obj"), nullptr);
  }
  // It is no longer open: committing it now is refused.
  EXPECT_THAT(CommitNow(*grant), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(CommitPipelineTest, ACommitTheHostTierRefusesLeavesThePreviousVersion) {
  absl::StatusOr<ReservationGrant> first = Reserve("s/obj", kObjectBytes);
  ASSERT_THAT(first, IsOk());
  Write(*first, /*seed=*/21, /*held_back=*/false);
  ASSERT_THAT(CommitNow(*first), IsOk());
  const uint64_t in_use = parts_->pool().used_bytes();

  // Larger than the whole host arena: the host tier refuses it.
  const uint64_t too_large = parts_->stack().arena().capacity() + kObjectBytes;
  absl::StatusOr<ReservationGrant> second = Reserve("s/obj", too_large);
  ASSERT_THAT(second, IsOk());
  Write(*second, /*seed=*/22, /*held_back=*/false);
  EXPECT_THAT(CommitNow(*second), StatusIs(absl::StatusCode::kResourceExhausted));

  ASSERT_TRUE(parts_->stored().Find("s/obj").has_value());
  EXPECT_EQ(parts_->stored().Find("s/obj")->size, kObjectBytes);
  EXPECT_TRUE(HostHolds("s/obj", kObjectBytes, /*seed=*/21));
  // The refused reservation's range went back to the pool.
  EXPECT_TRUE(AwaitPoolUse(in_use));
  absl::MutexLock lock(&parts_->mu);
  StagingObject* listed = parts_->residency().FindListed("s/obj");
  ASSERT_NE(listed, nullptr);
  EXPECT_EQ(listed->size, kObjectBytes);
  EXPECT_EQ(parts_->stats.reservations, 0u);
  EXPECT_TRUE(commits_->idle());
}

}  // namespace
}  // namespace tierd
