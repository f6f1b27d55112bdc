// object_layout on its own: grouping tensor names into objects, laying out each object (one file
// range or gathered), and checking layouts read back from disk. No files, no catalog.
#include "storage/model/object_layout.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

// An F32 tensor of `elements` at [begin, begin + 4 × elements) of file `file`.
SourceTensor F32(const std::string& name, uint32_t file, uint64_t begin, uint64_t elements) {
  return SourceTensor{name, DType::kF32, {elements}, file, begin, begin + 4 * elements};
}

std::vector<ModelFile> Files(std::vector<uint64_t> sizes) {
  std::vector<ModelFile> files;
  for (uint64_t size : sizes) files.push_back(ModelFile{"/m/f", size, 0, 0, 0});
  return files;
}

TEST(ObjectGrouperTest, DefaultRulesMapTensorsToBlocksAndPhases) {
  auto block = ObjectGrouper::Create(Grouping::kBlock, GroupingRules::Defaults());
  ASSERT_THAT(block, IsOk());
  EXPECT_EQ(block->ObjectNameFor("model.layers.3.mlp.up.weight"), "model.layers.3");
  EXPECT_EQ(block->ObjectNameFor("blocks.10.attn.qkv"), "blocks.10");
  EXPECT_EQ(block->ObjectNameFor("embed.weight"), "embed.weight");
  auto phase = ObjectGrouper::Create(Grouping::kPhase, GroupingRules::Defaults());
  ASSERT_THAT(phase, IsOk());
  EXPECT_EQ(phase->ObjectNameFor("blocks.1.attn2.to_k"), "blocks.1.cross_attn");
  EXPECT_EQ(phase->ObjectNameFor("blocks.1.attn.qkv"), "blocks.1.attn");
  EXPECT_EQ(phase->ObjectNameFor("blocks.1.mlp.fc1"), "blocks.1.ffn");
  EXPECT_EQ(phase->ObjectNameFor("blocks.1.scale_shift"), "blocks.1.other");
  auto tensor = ObjectGrouper::Create(Grouping::kTensor, GroupingRules::Defaults());
  ASSERT_THAT(tensor, IsOk());
  EXPECT_EQ(tensor->ObjectNameFor("blocks.1.attn.qkv"), "blocks.1.attn.qkv");
}

TEST(ObjectGrouperTest, ABlockPatternWithoutOneCaptureGroupIsRefused) {
  GroupingRules rules = GroupingRules::Defaults();
  rules.block_patterns = {R"(^blocks\.\d+\.)"};
  EXPECT_THAT(ObjectGrouper::Create(Grouping::kBlock, rules),
              StatusIs(absl::StatusCode::kInvalidArgument));
  rules.block_patterns = {"(unclosed"};
  EXPECT_THAT(ObjectGrouper::Create(Grouping::kBlock, rules),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LayOutObjectTest, BackToBackTensorsAreOneFileRange) {
  const ObjectInfo object = LayOutObject("b", {F32("b.y", 0, 1040, 4), F32("b.x", 0, 1024, 4)});
  EXPECT_EQ(object.size, 32u);
  ASSERT_EQ(object.extents.size(), 1u);
  EXPECT_EQ(object.extents[0].file_offset, 1024u);
  EXPECT_EQ(object.extents[0].length, 32u);
  ASSERT_EQ(object.tensors.size(), 2u);
  EXPECT_EQ(object.tensors[0].name, "b.x");  // in file order
  EXPECT_EQ(object.tensors[1].offset, 16u);
  EXPECT_THAT(ValidateObject(object, Files({4096})), IsOk());
}

TEST(LayOutObjectTest, TensorsApartAreGatheredAtTheGatherAlignment) {
  const ObjectInfo object =
      LayOutObject("b", {F32("b.x", 0, 100, 3), F32("b.y", 1, 500, 5), F32("b.z", 0, 2000, 1)});
  ASSERT_EQ(object.tensors.size(), 3u);
  for (const TensorPlacement& tensor : object.tensors) {
    EXPECT_EQ(tensor.offset % kGatheredTensorAlignment, 0u) << tensor.name;
  }
  EXPECT_EQ(object.extents.size(), 3u);
  EXPECT_THAT(ValidateObject(object, Files({4096, 4096})), IsOk());
}

TEST(BuildObjectsTest, ObjectsComeSortedByName) {
  auto grouper = ObjectGrouper::Create(Grouping::kBlock, GroupingRules::Defaults());
  ASSERT_THAT(grouper, IsOk());
  const std::vector<ObjectInfo> objects = BuildObjects(
      *grouper, {F32("blocks.1.w", 0, 0, 4), F32("blocks.0.w", 0, 16, 4), F32("head", 0, 32, 4)});
  std::vector<std::string> names;
  for (const ObjectInfo& object : objects) names.push_back(object.name);
  EXPECT_THAT(names, ElementsAre("blocks.0", "blocks.1", "head"));
}

TEST(ValidateObjectTest, ALayoutReachingPastItsFileIsRefused) {
  const ObjectInfo object = LayOutObject("b", {F32("b.x", 0, 0, 256)});
  const absl::Status refused = ValidateObject(object, Files({512}));
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("'b'"));
  EXPECT_THAT(ValidateObject(object, {}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CheckPlacementTest, SizeMustMatchDtypeAndShapeAndFitTheObject) {
  TensorPlacement tensor{"t", DType::kF32, {2, 3}, 0, 24};
  EXPECT_THAT(CheckPlacement(tensor, 24), IsOk());
  EXPECT_THAT(CheckPlacement(tensor, 20), StatusIs(absl::StatusCode::kInvalidArgument));
  tensor.size = 20;
  EXPECT_THAT(CheckPlacement(tensor, 100), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tierd
