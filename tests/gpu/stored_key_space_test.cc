// StoredKeySpace: which host-cache keys a client group's tier may act on, and the stored objects
// it lists.
#include "gpu/detail/stored_key_space.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_tier_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::GpuTestStack;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::StatusIs;

class StoredKeySpaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto stack = GpuTestStack::Create(/*blocks=*/1);
    ASSERT_THAT(stack, IsOk());
    stack_ = *std::move(stack);
  }

  std::unique_ptr<GpuTestStack> stack_;
};

TEST_F(StoredKeySpaceTest, GroupActsOnlyOnItsOwnStoredObjectsAndOnWeights) {
  StoredKeySpace group(stack_->catalog(), "group-a\x1f");
  group.Publish("s/mine", {16, nullptr});
  EXPECT_THAT(group.OwnHostKey("s/mine"), IsOkAndHolds(std::string("group-a\x1fs/mine")));
  EXPECT_THAT(group.OwnHostKey("m/blocks.0"), IsOkAndHolds(std::string("m/blocks.0")));
  EXPECT_THAT(group.OwnHostKey("s/theirs"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(group.OwnHostKey("no-slash"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(group.MayActOn("s/mine", /*stored=*/true));
  EXPECT_TRUE(group.MayActOn("m/blocks.0", /*stored=*/false));
  EXPECT_FALSE(group.MayActOn("s/theirs", /*stored=*/false));
}

TEST_F(StoredKeySpaceTest, DefaultTierActsOnWhateverTheHostCacheHolds) {
  StoredKeySpace tier(stack_->catalog(), "");
  EXPECT_THAT(tier.OwnHostKey("s/anything"), IsOkAndHolds(std::string("s/anything")));
  EXPECT_TRUE(tier.MayActOn("s/anything", /*stored=*/false));
  EXPECT_EQ(tier.HostKey("s/x", /*stored=*/true), "s/x");
}

TEST_F(StoredKeySpaceTest, ListsPublishedObjectsByKey) {
  StoredKeySpace space(stack_->catalog(), "p/");
  space.Publish("s/b", {2, nullptr});
  space.Publish("s/a", {1, nullptr});
  space.Publish("t/c", {3, nullptr});
  EXPECT_THAT(space.KeysUnder("s/"), ::testing::ElementsAre("s/a", "s/b"));
  ASSERT_TRUE(space.Find("s/b").has_value());
  EXPECT_EQ(space.Find("s/b")->size, 2u);
  EXPECT_EQ(space.HostKey("s/b", /*stored=*/true), "p/s/b");
  EXPECT_EQ(space.HostKey("m/blocks.0", /*stored=*/false), "m/blocks.0");
  EXPECT_TRUE(space.Remove("s/b"));
  EXPECT_FALSE(space.Remove("s/b"));
  EXPECT_FALSE(space.Contains("s/b"));
  EXPECT_FALSE(space.Find("s/b").has_value());
}

}  // namespace
}  // namespace tierd
