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
