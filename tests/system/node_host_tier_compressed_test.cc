// The node's host tier with weights held compressed (docs/COMPRESSION.md), across real daemon
// processes: each home compresses the objects it holds, lends them compressed to the node's other
// daemons, and every daemon decodes them on its own device to the file's bytes.
#include <cstring>
#include <vector>

#include "testing/sample_weights.h"
#include "tests/system/node_host_tier_test_fixture.h"

namespace tierd {
namespace {

using node_host_tier_test::kDaemons;
using node_host_tier_test::kTimeout;
using node_host_tier_test::NodeHostTierTest;
using ::tierd::testing::TensorSpec;

TEST_F(NodeHostTierTest, ObjectsHeldCompressedAreLentCompressedAndDecodedWhereTheyAreUsed) {
  // 8 objects of 256 KiB of bf16 weights N(0, 0.02²), as transformers initialises them.
  constexpr uint64_t kWords = 128 << 10;
  tensors_.clear();
  model_bytes_ = 0;
  for (int i = 0; i < 8; ++i) {
    std::vector<uint16_t> words(kWords);
    codec::FillNormalWeights(codec::WordLayout::kBf16, 0.02, 300 + i, words.data(), kWords);
    std::string bytes(2 * kWords, '\0');
    std::memcpy(bytes.data(), words.data(), bytes.size());
    tensors_.push_back(TensorSpec{absl::StrCat("w", i), "BF16", {kWords}, bytes});
    model_bytes_ += bytes.size();
  }
  ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/model.safetensors"), tensors_),
              testing::IsOk());
  StartDaemons();
  for (int i = 0; i < kDaemons; ++i) FetchAllAndCheck(i);
  for (int i = 0; i < kDaemons; ++i) ExpectHostLeasesDrain(i);

  // Each home swaps the compressed forms in once the copies that read the raw bytes are done.
  uint64_t compressed_objects = 0;
  uint64_t compressed_bytes = 0;
  for (const absl::Time deadline = absl::Now() + kTimeout; absl::Now() < deadline;) {
    compressed_objects = compressed_bytes = 0;
    for (int i = 0; i < kDaemons; ++i) {
      const v1::Stats stats = Stats(i);
      compressed_objects += stats.host_compressed_objects();
      compressed_bytes += stats.host_compressed_bytes();
    }
    if (compressed_objects == tensors_.size()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(compressed_objects, tensors_.size());
  EXPECT_LT(compressed_bytes, 0.75 * model_bytes_);

  std::vector<v1::Stats> before;
  for (int i = 0; i < kDaemons; ++i) before.push_back(Stats(i));
  for (int i = 0; i < kDaemons; ++i) {
    ASSERT_THAT(session(i).Evict("m/", v1::TIER_GPU), testing::IsOk());
    FetchAllAndCheck(i);
  }
  uint64_t disk = 0;
  for (int i = 0; i < kDaemons; ++i) {
    SCOPED_TRACE(absl::StrCat("daemon ", i));
    const v1::Stats after = Stats(i);
    // Every object came compressed, from this daemon's own host cache or from its home's.
    EXPECT_EQ(after.objects_decoded() - before[i].objects_decoded(), tensors_.size());
    EXPECT_EQ(after.bytes_host_to_gpu_compressed() - before[i].bytes_host_to_gpu_compressed(),
              compressed_bytes);
    EXPECT_EQ(after.decode_failures(), 0u);
    EXPECT_EQ(after.node_fallbacks(), 0u);
    disk += after.bytes_disk_to_host();
  }
  EXPECT_EQ(disk, model_bytes_);  // nothing read twice
}

}  // namespace
}  // namespace tierd
