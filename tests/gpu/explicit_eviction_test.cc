// ExplicitEviction on its own (over the loaders and the GPU test stack's host cache): an object no
// one holds leaves the tier asked for and only it; one that is leased is refused by key and
// skipped under a prefix; unknown and malformed keys are told apart; forgetting a model drops its
// weights from the GPU tier.
#include "gpu/detail/explicit_eviction.h"

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

using ::tierd::testing::GpuLoaders;
using ::tierd::testing::GpuParts;
using ::tierd::testing::GpuPartsOptions;
using ::tierd::testing::GpuTestStack;
using ::tierd::testing::IsOk;
using ::tierd::testing::kBlockBytes;
using ::tierd::testing::StatusIs;

class ExplicitEvictionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GpuPartsOptions options;
    options.blocks = 3;
    options.pool_bytes = 4 * kBlockBytes;
    options.slab_bytes = 4 * kBlockBytes;
    auto parts = GpuParts::Create(options);
    ASSERT_THAT(parts, IsOk());
    parts_ = *std::move(parts);
    loaders_ = std::make_unique<GpuLoaders>(*parts_);
    eviction_ = std::make_unique<ExplicitEviction>(parts_->tier(), parts_->host_cache(),
                                                   /*durable_store=*/nullptr, parts_->stored());
    absl::StatusOr<ClientId> client = parts_->OpenClient();
    ASSERT_THAT(client, IsOk());
    client_ = *client;
  }

  void TearDown() override {
    eviction_.reset();
    loaders_.reset();
    parts_.reset();
  }

  bool OnGpu(int block) {
    absl::MutexLock lock(&parts_->mu);
    return parts_->residency().FindListed(GpuTestStack::BlockKey(block)) != nullptr;
  }
  bool OnHost(int block) { return parts_->host_cache().IsResident(GpuTestStack::BlockKey(block)); }

  std::unique_ptr<GpuParts> parts_;
  std::unique_ptr<GpuLoaders> loaders_;
  std::unique_ptr<ExplicitEviction> eviction_;
  ClientId client_ = 0;
};

TEST_F(ExplicitEvictionTest, AnObjectNoOneHoldsLeavesTheTierAskedForAndOnlyIt) {
  ASSERT_THAT(loaders_->Prefetch(GpuTestStack::BlockKey(0)), IsOk());
  ASSERT_TRUE(OnGpu(0));
  ASSERT_TRUE(OnHost(0));

  absl::StatusOr<EvictResult> gpu = eviction_->Evict(GpuTestStack::BlockKey(0), EvictTier::kGpu);
  ASSERT_THAT(gpu, IsOk());
  EXPECT_EQ(gpu->evicted, 1u);
  EXPECT_FALSE(OnGpu(0));
  EXPECT_TRUE(OnHost(0));
  EXPECT_EQ(parts_->pool().used_bytes(), 0u);

  absl::StatusOr<EvictResult> host = eviction_->Evict(GpuTestStack::BlockKey(0), EvictTier::kHost);
  ASSERT_THAT(host, IsOk());
  EXPECT_EQ(host->evicted, 1u);
  EXPECT_FALSE(OnHost(0));
  EXPECT_EQ(parts_->stats_copy().evictions, 1u);
}

TEST_F(ExplicitEvictionTest, ALeasedObjectIsRefusedByKeyAndSkippedUnderAPrefix) {
  absl::StatusOr<LeaseGrant> lease = loaders_->Fetch(client_, GpuTestStack::BlockKey(1));
  ASSERT_THAT(lease, IsOk());
  ASSERT_THAT(loaders_->Prefetch(GpuTestStack::BlockKey(2)), IsOk());

  EXPECT_THAT(eviction_->Evict(GpuTestStack::BlockKey(1), EvictTier::kGpu),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  absl::StatusOr<EvictResult> all = eviction_->Evict("m/", EvictTier::kGpu);
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->evicted, 1u);  // block 2
  EXPECT_EQ(all->skipped, 1u);  // block 1, leased
  EXPECT_TRUE(OnGpu(1));
  EXPECT_FALSE(OnGpu(2));
  EXPECT_TRUE(loaders_->Holds(*lease, GpuTestStack::BlockBytes(1)));
}

TEST_F(ExplicitEvictionTest, UnknownAndMalformedKeysAreToldApart) {
  EXPECT_THAT(eviction_->Evict("m/blocks.9", EvictTier::kAll),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(eviction_->Evict("no-slash", EvictTier::kAll),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(eviction_->Evict("../", EvictTier::kAll),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ExplicitEvictionTest, ForgettingAModelDropsItsWeightsFromTheGpu) {
  ASSERT_THAT(loaders_->Prefetch(GpuTestStack::BlockKey(0)), IsOk());
  ASSERT_THAT(loaders_->Prefetch(GpuTestStack::BlockKey(1)), IsOk());
  eviction_->ForgetModel("m");
  EXPECT_FALSE(OnGpu(0));
  EXPECT_FALSE(OnGpu(1));
  EXPECT_EQ(parts_->pool().used_bytes(), 0u);
}

}  // namespace
}  // namespace tierd
