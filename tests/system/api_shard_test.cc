// Tensor-parallel shards through a real daemon process: a session fetches a shard key and gets
// tensor_split's slice of each tensor with its shape; tierctl gets and prefetches with --shard;
// bad specs are refused with INVALID_ARGUMENT at the edge.
#include "tests/system/api_test_fixture.h"

namespace tierd {
namespace api_test {
namespace {

// The fixture's tensor `name` as written.
testing::TensorSpec Written(const std::map<std::string, std::string>& expected,
                            const std::string& name) {
  return testing::TensorSpec{name, "F32", {kRows, kCols}, expected.at(name)};
}

TEST_F(ApiTest, ASessionFetchesATensorParallelShardOfEachTensor) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  for (uint32_t dim : {0u, 1u}) {
    for (uint32_t index = 0; index < 3; ++index) {
      const std::string key = ShardKey(Key(2), dim, index, 3);
      auto lease = (*session)->Fetch(key);
      ASSERT_THAT(lease, IsOk()) << key;
      const std::string bytes = Bytes(**session, *lease);
      ASSERT_EQ(lease->tensors().size(), 2u);
      for (const v1::TensorInfo& tensor : lease->tensors()) {
        const testing::TensorSpec whole = Written(expected_, tensor.name());
        const std::string want = testing::TensorSplit(whole, dim, index, 3);
        std::vector<uint64_t> shape = {kRows, kCols};
        shape[dim] = shape[dim] / 3 + (index < shape[dim] % 3 ? 1 : 0);
        EXPECT_EQ(std::vector<uint64_t>(tensor.shape().begin(), tensor.shape().end()), shape)
            << key;
        ASSERT_EQ(tensor.size(), want.size()) << key;
        EXPECT_EQ(bytes.compare(tensor.offset(), tensor.size(), want), 0)
            << key << " " << tensor.name();
      }
    }
  }
  for (const std::string& bad :
       {ShardKey(Key(2), 2, 0, 2), ShardKey(Key(2), 0, 3, 3), ShardKey(Key(2), 0, 0, 0),
        ShardKey(Key(2), 0, 0, kRows + 1), Key(2) + "@0:1"}) {
    EXPECT_THAT((*session)->Fetch(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT((*session)->Fetch(ShardKey("m/blocks.99", 0, 0, 2)),
              StatusIs(absl::StatusCode::kNotFound));
}

// One-column shards of a thousand-row tensor, each a slice of every row: read as itself, each
// would read a block of every row (the whole 4 MB tensor, a thousand times its 4000 bytes). The
// tensor is read once, and every shard is cut out of it in host memory on the way to the GPU.
TEST_F(ApiTest, OneColumnShardsOfAThousandRowTensorReadItOnceInAll) {
  const testing::TensorSpec wide = RandomTensor("w", "F32", {1000, 1024}, 77);
  ::mkdir(model_dir("wide").c_str(), 0755);
  ASSERT_THAT(
      testing::WriteSafetensors(absl::StrCat(model_dir("wide"), "/model.safetensors"), {wide}),
      IsOk());
  ASSERT_THAT(client_->RegisterModel("wide", model_dir("wide"), v1::GROUPING_TENSOR), IsOk());
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  const v1::Stats before = Stats();
  constexpr uint32_t kShards = 48;
  for (uint32_t i = 0; i < kShards; ++i) {
    const uint32_t index = i * 1024 / kShards + i % 7;
    const std::string key = ShardKey("wide/w", 1, index, 1024);
    auto lease = (*session)->Fetch(key);
    ASSERT_THAT(lease, IsOk()) << key;
    ASSERT_EQ(lease->tensors().size(), 1u);
    EXPECT_EQ(Bytes(**session, *lease).substr(lease->tensors()[0].offset(), 4000),
              testing::TensorSplit(wide, 1, index, 1024))
        << key;
    lease->Release();
  }
  // A copy's bytes are counted when it completes, which can be after its reader has the data.
  ASSERT_TRUE(WaitForStats([](const v1::Stats& s) { return s.copies_in_flight() == 0; }, kTimeout));
  const v1::Stats after = Stats();
  const uint64_t read = after.disk_bytes_read() - before.disk_bytes_read();
  EXPECT_GE(read, wide.data.size());
  EXPECT_LE(read, wide.data.size() + 2 * 4096) << "read more than the tensor once";
  EXPECT_EQ(after.shards_cut() - before.shards_cut(), kShards);
  EXPECT_EQ(after.bytes_host_to_gpu() - before.bytes_host_to_gpu(), kShards * 4000);
}

TEST_F(ApiTest, TierctlGetsAndPrefetchesShards) {
  ASSERT_EQ(Tierctl({"load", "p", model_dir("model"), "--group=tensor"}).exit_code, 0);
  const std::string tensor = "blocks.3.ffn.up.weight";
  EXPECT_EQ(Tierctl({"prefetch", "--shard=0:1/2", "p/" + tensor}).exit_code, 0);
  const std::string out = absl::StrCat(dir_.path(), "/shard.bin");
  for (const auto& [spec, dim, index] :
       {std::make_tuple("0:1/2", 0, 1), std::make_tuple("1:2/3", 1, 2)}) {
    auto got = Tierctl({"get", "p/" + tensor, absl::StrCat("--shard=", spec), "-o", out});
    EXPECT_EQ(got.exit_code, 0) << got.output;
    EXPECT_EQ(testing::ReadWholeFile(out),
              testing::TensorSplit(Written(expected_, tensor), dim, index, dim == 0 ? 2 : 3))
        << spec;
  }
  auto bad = RunProgram({"/bin/sh", "-c",
                         absl::StrCat(SiblingBinary("tierctl"), " --socket=", socket_path(),
                                      " get p/", tensor, " --shard=0:2/2 -o ", out, " 2>&1")},
                        kTimeout);
  ASSERT_THAT(bad, IsOk());
  EXPECT_EQ(bad->exit_code, 1);
  EXPECT_THAT(bad->output, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(bad->output, HasSubstr("index must be below the count"));
  EXPECT_EQ(Tierctl({"ls", "--shard=0:0/2"}).exit_code, 2);  // a flag ls does not take
}

}  // namespace
}  // namespace api_test
}  // namespace tierd
