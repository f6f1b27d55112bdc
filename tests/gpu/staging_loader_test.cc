// StagingLoader on its own (with its handoff copies, over the GPU test stack's host cache): a
// load copies the host tier's bytes into staging and answers every waiter with a lease on them;
// a lease through the host lands in the handoff buffer; what cannot be loaded — an unknown key,
// an object larger than a slab, a file that changed — is refused and leaves nothing listed. An
// object read from its file is copied on as it lands, and still served only once checked.
#include "gpu/detail/staging_loader.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_parts_test_support.h"
#include "tests/gpu_tier_test_support.h"
#include "tests/storage_test_support.h"
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
using ::tierd::testing::FlipByteKeepingMtime;
using ::tierd::testing::RandomTensor;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TensorSpec;
using ::tierd::testing::WriteSafetensors;

// Objects of several checksum segments (4 MiB), of an odd size: the last segment is short.
constexpr uint64_t kBigBytes = (10ull << 20) + 12;

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

  // Parts whose pool and arena take objects of several checksum segments, and model "big" of
  // `objects` of kBigBytes (keys BigKey(i)).
  void StartBig(int objects, uint64_t pool_bytes, bool copy_while_reading = true) {
    GpuPartsOptions options;
    options.pool_bytes = pool_bytes;
    options.slab_bytes = pool_bytes;
    options.arena_bytes = 64ull << 20;
    auto parts = GpuParts::Create(options);
    ASSERT_THAT(parts, IsOk());
    parts_ = *std::move(parts);
    const std::string dir = parts_->stack().dir() + "/big";
    std::filesystem::create_directories(dir);
    big_file_ = dir + "/model.safetensors";
    for (int i = 0; i < objects; ++i) {
      big_.push_back(RandomTensor(absl::StrCat("blocks.", i, ".w"), "U8", {kBigBytes}, 100 + i));
    }
    ASSERT_THAT(WriteSafetensors(big_file_, big_), IsOk());
    ASSERT_THAT(parts_->catalog()
                    .RegisterModel("big", dir, Grouping::kBlock, GroupingRules::Defaults(), nullptr)
                    .status(),
                IsOk());
    loaders_ = std::make_unique<GpuLoaders>(*parts_, 1 << 20, copy_while_reading);
    absl::StatusOr<ClientId> client = parts_->OpenClient();
    ASSERT_THAT(client, IsOk());
    client_ = *client;
  }
  static std::string BigKey(int i) { return absl::StrCat("big/blocks.", i); }

  // Reads `key` into the host cache (recording its checksum) and drops it from there again.
  void ReadIntoHostAndDrop(const std::string& key) {
    Answer<absl::StatusOr<HostObject>> read;
    parts_->host_cache().Fetch(key, ReadPriority::kDemand, absl::InfiniteFuture(),
                               read.Callback());
    absl::StatusOr<HostObject> object = read.Wait();
    ASSERT_THAT(object, IsOk());
    object->Reset();
    ASSERT_THAT(parts_->host_cache().Evict(key), IsOk());
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

  std::vector<TensorSpec> big_;
  std::string big_file_;
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

TEST_F(StagingLoaderTest, AnObjectReadFromItsFileIsCopiedOnAsItLands) {
  StartBig(/*objects=*/1, /*pool_bytes=*/16ull << 20);
  absl::StatusOr<LeaseGrant> lease = loaders_->Fetch(client_, BigKey(0));
  ASSERT_THAT(lease, IsOk());
  EXPECT_TRUE(loaders_->Holds(*lease, big_[0].data));
  // Every segment was told, and copied, before the host tier answered.
  GpuTierStats stats = StatsOnceCopied();
  EXPECT_EQ(stats.bytes_host_to_gpu, kBigBytes);
  EXPECT_EQ(stats.bytes_copied_as_landed, kBigBytes);
}

TEST_F(StagingLoaderTest, WithoutCopyWhileReadingAnObjectIsCopiedOnceRead) {
  StartBig(/*objects=*/1, /*pool_bytes=*/16ull << 20, /*copy_while_reading=*/false);
  absl::StatusOr<LeaseGrant> lease = loaders_->Fetch(client_, BigKey(0));
  ASSERT_THAT(lease, IsOk());
  EXPECT_TRUE(loaders_->Holds(*lease, big_[0].data));
  const GpuTierStats stats = StatsOnceCopied();
  EXPECT_EQ(stats.bytes_host_to_gpu, kBigBytes);
  EXPECT_EQ(stats.bytes_copied_as_landed, 0u);
}

TEST_F(StagingLoaderTest, AnObjectResidentInTheHostTierIsCopiedWhole) {
  StartBig(/*objects=*/1, /*pool_bytes=*/16ull << 20);
  Answer<absl::StatusOr<HostObject>> read;
  parts_->host_cache().Fetch(BigKey(0), ReadPriority::kDemand, absl::InfiniteFuture(),
                             read.Callback());
  absl::StatusOr<HostObject> held = read.Wait();
  ASSERT_THAT(held, IsOk());
  absl::StatusOr<LeaseGrant> lease = loaders_->Fetch(client_, BigKey(0));
  ASSERT_THAT(lease, IsOk());
  EXPECT_TRUE(loaders_->Holds(*lease, big_[0].data));
  GpuTierStats stats = StatsOnceCopied();
  EXPECT_EQ(stats.bytes_host_to_gpu, kBigBytes);
  EXPECT_EQ(stats.bytes_copied_as_landed, 0u);  // nothing landed: it was there
  held->Reset();
}

TEST_F(StagingLoaderTest, BytesCopiedAsTheyLandAreNeverLeasedWhenTheObjectFailsItsCheck) {
  StartBig(/*objects=*/1, /*pool_bytes=*/16ull << 20);
  ReadIntoHostAndDrop(BigKey(0));  // its checksum is recorded
  // A byte of the last segment changes under the same metadata: the first two segments land,
  // are copied on, and then the object fails its check.
  ASSERT_THAT(FlipByteKeepingMtime(big_file_, std::filesystem::file_size(big_file_) - 5), IsOk());
  EXPECT_THAT(loaders_->Fetch(client_, BigKey(0)), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_FALSE(Listed(BigKey(0)));
  // Its staging goes back once the stream has run the copies made while it was read.
  EXPECT_TRUE(parts_->AwaitQuiet([this] { return parts_->pool().used_bytes() == 0; }));
  EXPECT_EQ(StatsOnceCopied().bytes_copied_as_landed, 0u);
  {
    absl::MutexLock lock(&parts_->mu);
    EXPECT_EQ(parts_->residency().copies_in_flight(), 0u);
  }
  // Put right, it loads, exact, copied as it lands.
  ASSERT_THAT(FlipByteKeepingMtime(big_file_, std::filesystem::file_size(big_file_) - 5), IsOk());
  absl::StatusOr<LeaseGrant> lease = loaders_->Fetch(client_, BigKey(0));
  ASSERT_THAT(lease, IsOk());
  EXPECT_TRUE(loaders_->Holds(*lease, big_[0].data));
  EXPECT_EQ(StatsOnceCopied().bytes_copied_as_landed, kBigBytes);
}

TEST_F(StagingLoaderTest, WithoutFreeRoomAnObjectIsCopiedOnceReadAsBefore) {
  // Room for one object and a half: the second finds no free room while it lands, and takes the
  // first's place (evicted) once read.
  StartBig(/*objects=*/2, /*pool_bytes=*/kBigBytes * 3 / 2);
  ASSERT_THAT(loaders_->Prefetch(BigKey(0)), IsOk());
  EXPECT_EQ(StatsOnceCopied().bytes_copied_as_landed, kBigBytes);
  absl::StatusOr<LeaseGrant> lease = loaders_->Fetch(client_, BigKey(1));
  ASSERT_THAT(lease, IsOk());
  EXPECT_TRUE(loaders_->Holds(*lease, big_[1].data));
  const GpuTierStats stats = StatsOnceCopied();
  EXPECT_EQ(stats.bytes_host_to_gpu, 2 * kBigBytes);
  EXPECT_EQ(stats.bytes_copied_as_landed, kBigBytes);  // the first's only
  EXPECT_EQ(stats.evictions, 1u);
  EXPECT_FALSE(Listed(BigKey(0)));
}

}  // namespace
}  // namespace tierd
