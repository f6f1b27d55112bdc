// Weights kept compressed in the host cache and decoded in staging, in-process on the host device:
// the compressor swaps the compressed form in after a read, fetches decode it to the file's bytes,
// what does not gain stays raw, the swap waits for the raw bytes' readers, and a compressed form
// that does not decode to its checksums is DATA_LOSS once and read again from the file after, and
// the decodes' device time is counted.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/sample_weights.h"
#include "common/status_macros.h"
#include "device/device_wrapper.h"
#include "gpu/gpu_tier.h"
#include "gtest/gtest.h"
#include "tests/gpu_tier_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::Answer;
using ::tierd::testing::FetchNow;
using ::tierd::testing::GpuTestStack;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TensorSpec;

constexpr uint64_t kWeightWords = 128 << 10;  // 256 KiB of bf16 each
constexpr int kWeights = 4;

// A bf16 tensor of N(0, 0.02²) weights, as transformers initialises them.
TensorSpec NormalWeight(const std::string& name, uint64_t seed) {
  std::vector<uint16_t> words(kWeightWords);
  codec::FillNormalWeights(codec::WordLayout::kBf16, 0.02, seed, words.data(), words.size());
  std::string bytes(2 * words.size(), '\0');
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return {name, "BF16", {kWeightWords}, bytes};
}

class GpuTierCompressedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostCacheOptions host_cache;
    host_cache.compress_weights = true;
    auto stack = GpuTestStack::Create(/*blocks=*/1, wrap_, host_cache);
    ASSERT_THAT(stack, IsOk());
    stack_ = *std::move(stack);
    GpuTierOptions options;
    options.pool_bytes = 4 << 20;
    options.slab_bytes = 1 << 20;
    options.copy_chunk_bytes = 64 << 10;
    options.close_grace = absl::Milliseconds(200);
    options.check_decodes_before_serving = check_decodes_before_serving_;
    // The least scratch: its rings wrap every few dozen objects.
    options.decode_scratch_bytes = 56 << 20;
    ASSERT_THAT(stack_->StartTier(options), IsOk());
    absl::StatusOr<ClientId> client = tier().OpenClient(ClientLimits{});
    ASSERT_THAT(client, IsOk());
    client_ = *client;

    for (int i = 0; i < kWeights; ++i) {
      weights_.push_back(NormalWeight(absl::StrCat("layers.", i, ".w"), 100 + i));
    }
    // Random bytes: nothing to gain.
    weights_.push_back(testing::RandomTensor("noise", "BF16", {kWeightWords}, 7));
    const std::string dir = absl::StrCat(dir_.path(), "/w");
    std::filesystem::create_directories(dir);
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(dir, "/model.safetensors"), weights_),
                IsOk());
    ASSERT_THAT(stack_->catalog()
                    .RegisterModel("w", dir, Grouping::kTensor, GroupingRules::Defaults(), nullptr)
                    .status(),
                IsOk());
  }

  static std::string Key(const TensorSpec& weight) { return absl::StrCat("w/", weight.name); }

  // Fetches `key` through the GPU tier; its bytes in staging, or the fetch's error.
  absl::StatusOr<std::string> Fetch(const std::string& key) {
    absl::StatusOr<LeaseGrant> lease = FetchNow(tier(), client_, key);
    if (!lease.ok()) return lease.status();
    if (lease->ready_event) {
      EXPECT_THAT(stack_->device().SynchronizeEvent(tier().events().event(*lease->ready_event)),
                  IsOk());
    }
    std::string bytes(reinterpret_cast<const char*>(tier().pool().data(lease->range)),
                      lease->length);
    EXPECT_THAT(tier().Release(client_, lease->lease_id, std::nullopt), IsOk());
    return bytes;
  }

  // Waits until the compressor has had `objects` objects (encoded or kept raw).
  bool WaitForCompressor(uint64_t objects) {
    const absl::Time deadline = absl::Now() + testing::kAnswerTimeout;
    while (absl::Now() < deadline) {
      const HostCacheStats stats = stack_->host_cache().stats();
      if (stats.objects_encoded + stats.objects_kept_raw >= objects) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  // Drops every GPU copy, so that the next fetches come from the host cache.
  void EvictGpu() {
    ASSERT_TRUE(testing::WaitForCopies(tier()));
    ASSERT_THAT(tier().Evict("w/", EvictTier::kGpu), IsOk());
  }

  // A bit flips in host memory, among the tiles of `key`'s compressed form.
  void FlipABitOfTheCompressedForm(const std::string& key) {
    Answer<absl::StatusOr<HostObject>> held;
    stack_->host_cache().Fetch(key, ReadPriority::kDemand, absl::InfiniteFuture(), held.Callback());
    absl::StatusOr<HostObject> compressed = held.Wait();
    ASSERT_THAT(compressed, IsOk());
    ASSERT_NE(compressed->compressed(), nullptr);
    compressed->data()[compressed->stored_size() - 1000] ^= 0x08;
  }

  GpuTier& tier() { return *stack_->tier; }

  bool check_decodes_before_serving_ = true;
  GpuTestStack::WrapDevice wrap_;
  testing::TempDir dir_;
  std::unique_ptr<GpuTestStack> stack_;
  ClientId client_ = 0;
  std::vector<TensorSpec> weights_;
};

TEST_F(GpuTierCompressedTest, WeightsAreHeldCompressedAndDecodedToTheirBytes) {
  uint64_t raw_bytes = 0;
  for (const TensorSpec& weight : weights_) {
    // The first fetch is served the raw bytes, read from the file.
    EXPECT_EQ(Fetch(Key(weight)).value_or(""), weight.data) << weight.name;
    raw_bytes += weight.data.size();
  }
  ASSERT_TRUE(WaitForCompressor(weights_.size()));
  const HostCacheStats host = stack_->host_cache().stats();
  EXPECT_EQ(host.objects_encoded, uint64_t{kWeights});
  EXPECT_EQ(host.objects_kept_raw, 1u);  // the noise
  EXPECT_EQ(host.compressed_objects, uint64_t{kWeights});
  EXPECT_LT(host.compressed_bytes, 0.75 * host.compressed_raw_bytes);
  // The host cache holds the model in less than it takes raw.
  EXPECT_LT(host.used_bytes,
            raw_bytes - (host.compressed_raw_bytes - host.compressed_bytes) + 64 * 1024);

  EvictGpu();
  const GpuTierStats before = tier().stats();
  for (const TensorSpec& weight : weights_) {
    EXPECT_EQ(Fetch(Key(weight)).value_or(""), weight.data) << weight.name;
  }
  // A raw copy's bytes are counted once its completion has been seen, after its readers may be.
  ASSERT_TRUE(testing::WaitForCopies(tier()));
  const GpuTierStats after = tier().stats();
  EXPECT_EQ(after.objects_decoded - before.objects_decoded, uint64_t{kWeights});
  EXPECT_EQ(after.bytes_host_to_gpu_compressed - before.bytes_host_to_gpu_compressed,
            host.compressed_bytes);
  EXPECT_EQ(after.bytes_host_to_gpu - before.bytes_host_to_gpu, raw_bytes);
  EXPECT_EQ(after.decode_failures, 0u);
  // Nothing was read from disk again.
  EXPECT_EQ(stack_->host_cache().stats().bytes_from_disk, raw_bytes);
}

TEST_F(GpuTierCompressedTest, ObjectsKeepTheirBytesAsTheScratchRingsWrapAround) {
  for (const TensorSpec& weight : weights_) ASSERT_THAT(Fetch(Key(weight)), IsOk());
  ASSERT_TRUE(WaitForCompressor(weights_.size()));
  // 400 decodes: the tiles ring (a MiB a piece here) wraps a dozen times, the tables ring (64 KiB
  // a table) once.
  constexpr int kRounds = 100;
  for (int round = 0; round < kRounds; ++round) {
    EvictGpu();
    for (const TensorSpec& weight : weights_) {
      ASSERT_EQ(Fetch(Key(weight)).value_or(""), weight.data) << weight.name << " " << round;
    }
  }
  ASSERT_TRUE(testing::WaitForCopies(tier()));
  EXPECT_GE(tier().stats().objects_decoded, uint64_t{kRounds * kWeights});
  EXPECT_EQ(tier().stats().decode_failures, 0u);
}

TEST_F(GpuTierCompressedTest, TheSwapWaitsForTheRawBytesReaders) {
  const TensorSpec& weight = weights_[0];
  Answer<absl::StatusOr<HostObject>> held;
  stack_->host_cache().Fetch(Key(weight), ReadPriority::kDemand, absl::InfiniteFuture(),
                             held.Callback());
  absl::StatusOr<HostObject> raw = held.Wait();
  ASSERT_THAT(raw, IsOk());
  ASSERT_EQ(raw->compressed(), nullptr);
  // While this reference is held the compressor has encoded the object but may not swap it in:
  // the bytes under the reference stay the raw ones.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(stack_->host_cache().stats().objects_encoded, 0u);
  EXPECT_EQ(std::memcmp(raw->data(), weight.data.data(), weight.data.size()), 0);
  raw->Reset();
  ASSERT_TRUE(WaitForCompressor(1));
  EXPECT_EQ(stack_->host_cache().stats().compressed_objects, 1u);
  EXPECT_EQ(Fetch(Key(weight)).value_or(""), weight.data);
}

TEST_F(GpuTierCompressedTest, ACorruptedCompressedFormIsDataLossThenReadAgain) {
  const TensorSpec& weight = weights_[1];
  ASSERT_EQ(Fetch(Key(weight)).value_or(""), weight.data);
  ASSERT_TRUE(WaitForCompressor(1));
  EvictGpu();
  FlipABitOfTheCompressedForm(Key(weight));
  EXPECT_THAT(Fetch(Key(weight)), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(tier().stats().decode_failures, 1u);
  // The corrupted copy was dropped: the next fetch reads the file again, and is right.
  ASSERT_TRUE(testing::WaitForCopies(tier()));
  EXPECT_EQ(Fetch(Key(weight)).value_or(""), weight.data);
  EXPECT_EQ(stack_->host_cache().stats().bytes_from_disk, 2 * weight.data.size());
}

// A device whose decodes each take at least kDecodeStall longer, on the decode's stream.
class SlowDecodeDevice : public DeviceWrapper {
 public:
  static constexpr absl::Duration kDecodeStall = absl::Milliseconds(40);
  using DeviceWrapper::DeviceWrapper;

  absl::Status DecodeAsync(Stream& stream, const codec::CompressedLayout& layout,
                           const codec::TileTables& tables, const void* tiles, void* dst,
                           uint64_t first_tile, uint64_t tile_count, uint32_t* verdict) override {
    RETURN_IF_ERROR(LaunchHostFunction(stream, [] { absl::SleepFor(kDecodeStall); }));
    ++decodes_;
    return DeviceWrapper::DecodeAsync(stream, layout, tables, tiles, dst, first_tile, tile_count,
                                      verdict);
  }
  int decodes() const { return decodes_; }

 private:
  std::atomic<int> decodes_{0};
};

class GpuTierCompressedSlowDecodeTest : public GpuTierCompressedTest {
 protected:
  GpuTierCompressedSlowDecodeTest() {
    wrap_ = [this](Device& host) {
      auto device = std::make_unique<SlowDecodeDevice>(host);
      device_ = device.get();
      return device;
    };
  }
  SlowDecodeDevice* device_ = nullptr;
};

TEST_F(GpuTierCompressedSlowDecodeTest, DecodeTimeIsTheDevicesTimeInTheDecodes) {
  for (const TensorSpec& weight : weights_) ASSERT_THAT(Fetch(Key(weight)), IsOk());
  ASSERT_TRUE(WaitForCompressor(weights_.size()));
  EXPECT_EQ(tier().stats().decode_micros, 0u);  // nothing decoded yet: served raw
  EvictGpu();
  const absl::Time start = absl::Now();
  for (const TensorSpec& weight : weights_) {
    EXPECT_EQ(Fetch(Key(weight)).value_or(""), weight.data) << weight.name;
  }
  const absl::Duration fetching = absl::Now() - start;
  ASSERT_TRUE(testing::WaitForCopies(tier()));
  ASSERT_EQ(device_->decodes(), kWeights);  // one launch each
  const absl::Duration decoding = absl::Microseconds(tier().stats().decode_micros);
  EXPECT_GE(decoding, kWeights * SlowDecodeDevice::kDecodeStall);
  // Only the decodes: the fetches, one after another, took all of it and their copies besides.
  EXPECT_LE(decoding, fetching);
}

// Fetches answered when the decode is enqueued (check_decodes_before_serving off): the readers
// wait on a ready event after the decode and find the object's bytes; a decode that fails its
// check is still counted, and its object dropped from the GPU and the host cache.
class GpuTierCompressedUncheckedTest : public GpuTierCompressedTest {
 protected:
  GpuTierCompressedUncheckedTest() { check_decodes_before_serving_ = false; }
};

TEST_F(GpuTierCompressedUncheckedTest, ReadersWaitOnTheDecodeAndAFailureIsStillCaught) {
  const TensorSpec& weight = weights_[2];
  ASSERT_EQ(Fetch(Key(weight)).value_or(""), weight.data);
  ASSERT_TRUE(WaitForCompressor(1));
  EvictGpu();
  EXPECT_EQ(Fetch(Key(weight)).value_or(""), weight.data);  // waits on the ready event
  ASSERT_TRUE(testing::WaitForCopies(tier()));
  EXPECT_EQ(tier().stats().objects_decoded, 1u);
  EvictGpu();
  FlipABitOfTheCompressedForm(Key(weight));
  // Served before the check: this lease has the wrong bytes, which the check then finds.
  EXPECT_NE(Fetch(Key(weight)).value_or(""), weight.data);
  ASSERT_TRUE(testing::WaitForCopies(tier()));
  EXPECT_EQ(tier().stats().decode_failures, 1u);
  EXPECT_FALSE(tier().IsOnGpu(Key(weight)));
  EXPECT_EQ(Fetch(Key(weight)).value_or(""), weight.data);  // read from the file again
}

TEST_F(GpuTierCompressedTest, NothingIsCompressedWhenItIsOff) {
  stack_.reset();  // a stack without compression
  auto stack = GpuTestStack::Create(/*blocks=*/2);
  ASSERT_THAT(stack, IsOk());
  ASSERT_TRUE(stack.value()->host_cache().stats().objects_encoded == 0);
  GpuTierOptions options;
  options.pool_bytes = 1 << 20;
  options.slab_bytes = 1 << 20;
  ASSERT_THAT((*stack)->StartTier(options), IsOk());
  absl::StatusOr<ClientId> client = (*stack)->tier->OpenClient(ClientLimits{});
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT(FetchNow(*(*stack)->tier, *client, GpuTestStack::BlockKey(0)), IsOk());
  absl::SleepFor(absl::Milliseconds(100));
  const HostCacheStats host = (*stack)->host_cache().stats();
  EXPECT_EQ(host.objects_encoded + host.objects_kept_raw, 0u);
  (*stack)->tier->CloseClient(*client);
}

}  // namespace
}  // namespace tierd
