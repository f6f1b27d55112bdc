// StagingLoader on its own (with its handoff copies, over the GPU test stack's host cache): a
// load copies the host tier's bytes into staging and answers every waiter with a lease on them;
// a lease through the host lands in the handoff buffer; what cannot be loaded — an unknown key,
// an object larger than a slab, a file that changed — is refused and leaves nothing listed.
#include "gpu/detail/staging_loader.h"

#include <unistd.h>

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_parts_test_support.h"
#include "tests/gpu_tier_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::Answer;
using ::tierd::testing::GpuLoaders;
using ::tierd::testing::GpuParts;
using ::tierd::testing::GpuPartsOptions;
using ::tierd::testing::GpuTestStack;
using ::tierd::testing::IsOk;
using ::tierd::testing::kBlockBytes;
using ::tierd::testing::StatusIs;

class StagingLoaderTest : public ::testing::Test {
 protected:
  void Start(uint64_t slab_bytes = 4 * kBlockBytes) {
    GpuPartsOptions options;
    options.blocks = 3;
    options.pool_bytes = 4 * kBlockBytes;
    options.slab_bytes = slab_bytes;
    auto parts = GpuParts::Create(options);
    ASSERT_THAT(parts, IsOk());
    parts_ = *std::move(parts);
    loaders_ = std::make_unique<GpuLoaders>(*parts_);
    absl::StatusOr<ClientId> client = parts_->OpenClient();
    ASSERT_THAT(client, IsOk());
    client_ = *client;
  }

  void TearDown() override {
    loaders_.reset();
    parts_.reset();
  }

  // Waits until the copies in flight are done and counted (a lease may come before its copy is).
  GpuTierStats StatsOnceCopied() {
    EXPECT_TRUE(parts_->AwaitQuiet([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return parts_->residency().copies_in_flight() == 0;
    }));
    return parts_->stats_copy();
  }

  bool Listed(const std::string& key) {
    absl::MutexLock lock(&parts_->mu);
    return parts_->residency().FindListed(key) != nullptr;
  }

  std::unique_ptr<GpuParts> parts_;
  std::unique_ptr<GpuLoaders> loaders_;
  ClientId client_ = 0;
};

TEST_F(StagingLoaderTest, ALoadCopiesTheHostBytesIntoStagingAndLeasesThem) {
  Start();
  absl::StatusOr<LeaseGrant> lease = loaders_->Fetch(client_, GpuTestStack::BlockKey(1));
  ASSERT_THAT(lease, IsOk());
  EXPECT_EQ(lease->key, GpuTestStack::BlockKey(1));
  EXPECT_EQ(lease->length, kBlockBytes);
  EXPECT_TRUE(loaders_->Holds(*lease, GpuTestStack::BlockBytes(1)));
  EXPECT_TRUE(Listed(GpuTestStack::BlockKey(1)));
  // A second lease of the resident object reads the same range.
  absl::StatusOr<LeaseGrant> again = loaders_->Fetch(client_, GpuTestStack::BlockKey(1));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->range.offset, lease->range.offset);
  const GpuTierStats stats = StatsOnceCopied();
  EXPECT_EQ(stats.bytes_host_to_gpu, kBlockBytes);
  EXPECT_EQ(stats.leases, 2u);
}

TEST_F(StagingLoaderTest, EveryWaiterOfOneLoadIsAnsweredWithALease) {
  Start();
  absl::StatusOr<ClientId> other = parts_->OpenClient();
  ASSERT_THAT(other, IsOk());
  Answer<absl::StatusOr<LeaseGrant>> first, second;
  {
    DeferredCalls deferred;
    absl::MutexLock lock(&parts_->mu);
    absl::StatusOr<StagingObject*> object =
        loaders_->loader().StartLoad(GpuTestStack::BlockKey(0), ReadPriority::kPrefetch,
                                     absl::InfiniteFuture(), deferred.calls());
    ASSERT_THAT(object, IsOk());
    for (auto [client, answer] : {std::pair{client_, &first}, std::pair{*other, &second}}) {
      ++parts_->clients().Find(client)->pending_fetches;
      (*object)->waiters.push_back({client, answer->Callback(), nullptr, false});
    }
  }
  absl::StatusOr<LeaseGrant> a = first.Wait(), b = second.Wait();
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->range.offset, b->range.offset);  // one object, leased to each
  EXPECT_TRUE(loaders_->Holds(*a, GpuTestStack::BlockBytes(0)));
  EXPECT_TRUE(loaders_->Holds(*b, GpuTestStack::BlockBytes(0)));
  const GpuTierStats stats = StatsOnceCopied();
  EXPECT_EQ(stats.bytes_host_to_gpu, kBlockBytes);  // one copy for both
  EXPECT_EQ(stats.leases, 2u);
}

TEST_F(StagingLoaderTest, ALeaseThroughTheHostLandsInTheHandoffBuffer) {
  Start();
  absl::StatusOr<LeaseGrant> lease =
      loaders_->Fetch(client_, GpuTestStack::BlockKey(2), /*through_host=*/true);
  ASSERT_THAT(lease, IsOk());
  ASSERT_TRUE(lease->host_offset.has_value());
  ASSERT_TRUE(lease->ready_event.has_value());  // the record after the copy out
  EXPECT_TRUE(loaders_->Holds(*lease, GpuTestStack::BlockBytes(2)));
  EXPECT_EQ(StatsOnceCopied().bytes_gpu_to_host, kBlockBytes);
}

TEST_F(StagingLoaderTest, AnUnknownKeyIsNotFoundAndListsNothing) {
  Start();
  for (const std::string key : {"m/blocks.9", "s/never-stored"}) {
    EXPECT_THAT(loaders_->Fetch(client_, key), StatusIs(absl::StatusCode::kNotFound)) << key;
    EXPECT_FALSE(Listed(key));
  }
}

TEST_F(StagingLoaderTest, AnObjectLargerThanASlabIsRefusedBeforeItIsRead) {
  Start(/*slab_bytes=*/kBlockBytes / 2);
  EXPECT_THAT(loaders_->Fetch(client_, GpuTestStack::BlockKey(0)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(Listed(GpuTestStack::BlockKey(0)));
  EXPECT_EQ(parts_->stats_copy().bytes_host_to_gpu, 0u);
}

TEST_F(StagingLoaderTest, AFailedHostFetchAnswersItsWaitersAndUnlistsTheObject) {
  Start();
  // The model file cut short under the host cache: its read of the block fails.
  ASSERT_EQ(::truncate(parts_->stack().model_file().c_str(), 100), 0);
  absl::StatusOr<LeaseGrant> lease = loaders_->Fetch(client_, GpuTestStack::BlockKey(2));
  EXPECT_FALSE(lease.ok());
  EXPECT_FALSE(Listed(GpuTestStack::BlockKey(2)));
  {
    absl::MutexLock lock(&parts_->mu);
    EXPECT_EQ(parts_->clients().Find(client_)->pending_fetches, 0u);
  }
  EXPECT_EQ(parts_->pool().used_bytes(), 0u);  // the range it was given went back
}

}  // namespace
}  // namespace tierd
