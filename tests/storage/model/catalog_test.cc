// The catalog's grouping of tensors into objects and the objects' layout: a realistic model under
// every grouping, contiguous and gathered objects, zero-size tensors, custom and bad grouping
// rules. The other catalog_*_test.cc files hold the rest of this binary's tests: names and
// registration errors, index files, persistence, model roots.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/model/object_layout.h"
#include "tests/storage/model/catalog_test_fixture.h"

namespace tierd {
namespace catalog_test {
namespace {

// Where a tensor's data starts in a file written by WriteSafetensors(specs): just after the header.
uint64_t DataStart(const std::vector<TensorSpec>& specs) {
  return 8 + SafetensorsHeaderJson(specs).size();
}

// The objects each grouping should produce for a DiT model, with their tensors.
std::map<std::string, std::set<std::string>> ExpectedDitObjects(const DitModel& model,
                                                                Grouping grouping) {
  std::map<std::string, std::set<std::string>> objects;
  for (const auto& [name, spec] : model.tensors) {
    auto block = model.block.find(name);
    std::string object = name;
    if (block != model.block.end() && grouping == Grouping::kBlock) {
      object = absl::StrCat("blocks.", block->second);
    } else if (block != model.block.end() && grouping == Grouping::kPhase) {
      object = absl::StrCat("blocks.", block->second, ".", model.phase.at(name));
    }
    objects[object].insert(name);
  }
  return objects;
}

// --- Grouping and layout of a realistic model ----------------------------------------------------

class CatalogGroupingTest : public CatalogTest, public ::testing::WithParamInterface<Grouping> {};

TEST_P(CatalogGroupingTest, DitModelObjectsHoldTheRightTensorsAndReadBackByteExact) {
  const std::string dir = ModelDir("dit");
  const DitModel dit = WriteDitModel(dir);
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);

  auto summary = catalog->RegisterModel("dit", dir, GetParam(), GroupingRules::Defaults());
  ASSERT_THAT(summary, IsOk());
  auto model = catalog->GetModel("dit");
  ASSERT_THAT(model, IsOk());
  const ModelInfo& info = **model;

  const auto expected = ExpectedDitObjects(dit, GetParam());
  std::vector<std::string> expected_names;
  for (const auto& [name, tensors] : expected) expected_names.push_back(name);
  EXPECT_THAT(ObjectNames(info), ElementsAreArray(expected_names));  // sorted by name
  for (const ObjectInfo& object : info.objects) {
    ASSERT_EQ(expected.count(object.name), 1u) << object.name;
    EXPECT_THAT(TensorNames(object), UnorderedElementsAreArray(expected.at(object.name)))
        << object.name;
  }
  ExpectObjectsReproduceTensors(info, dit.tensors);

  EXPECT_EQ(summary->name, "dit");
  EXPECT_EQ(summary->directory, dir);
  EXPECT_EQ(summary->grouping, GetParam());
  EXPECT_EQ(summary->files, 2u);
  EXPECT_EQ(summary->objects, expected.size());
  EXPECT_EQ(summary->tensors, dit.tensors.size());
  EXPECT_EQ(summary->total_bytes, info.total_bytes);
  ASSERT_EQ(info.files.size(), 2u);
  EXPECT_EQ(info.files[0].path, dir + "/diffusion_pytorch_model-00001-of-00002.safetensors");
  EXPECT_EQ(info.files[0].size, std::filesystem::file_size(info.files[0].path));
}

INSTANTIATE_TEST_SUITE_P(AllGroupings, CatalogGroupingTest,
                         ::testing::Values(Grouping::kTensor, Grouping::kBlock, Grouping::kPhase),
                         [](const ::testing::TestParamInfo<Grouping>& info) {
                           return std::string(GroupingName(info.param));
                         });

TEST_F(CatalogTest, BlockOneAndBlockTenAreDifferentObjects) {
  const std::string dir = ModelDir("dit");
  WriteDitModel(dir);
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  ASSERT_THAT(catalog->RegisterModel("dit", dir, Grouping::kBlock, GroupingRules::Defaults()),
              IsOk());
  auto block1 = catalog->Lookup("dit/blocks.1");
  ASSERT_THAT(block1, IsOk());
  for (const TensorPlacement& tensor : block1->object->tensors) {
    EXPECT_TRUE(absl::StartsWith(tensor.name, "blocks.1.")) << tensor.name;
  }
  EXPECT_EQ(block1->object->tensors.size(), 7u);
  EXPECT_EQ(block1->key, "dit/blocks.1");
  EXPECT_THAT(catalog->Lookup("dit/blocks.10"), IsOk());
  EXPECT_THAT(catalog->Lookup("dit/blocks.11"), IsOk());
}

TEST_F(CatalogTest, BlockSpanningTwoFilesIsGatheredFromBoth) {
  const std::string dir = ModelDir("dit");
  WriteDitModel(dir);
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  ASSERT_THAT(catalog->RegisterModel("dit", dir, Grouping::kBlock, GroupingRules::Defaults()),
              IsOk());
  auto block2 = catalog->Lookup("dit/blocks.2");
  ASSERT_THAT(block2, IsOk());
  std::set<uint32_t> files;
  for (const Extent& extent : block2->object->extents) files.insert(extent.file);
  EXPECT_THAT(files, ElementsAre(0u, 1u));
  for (const TensorPlacement& tensor : block2->object->tensors) {
    EXPECT_EQ(tensor.offset % kGatheredTensorAlignment, 0u) << tensor.name;
  }
}

TEST_F(CatalogTest, DefaultRulesGroupCommonLayoutsIntoBlocksAndPhases) {
  auto grouper = ObjectGrouper::Create(Grouping::kPhase, GroupingRules::Defaults());
  ASSERT_THAT(grouper, IsOk());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.layers.3.mlp.up.weight", "model.layers.3.ffn"},
      {"model.layers.3.self_attn.q_proj.weight", "model.layers.3.attn"},
      {"model.layers.3.input_layernorm.weight", "model.layers.3.norm"},
      {"model.layers.31.post_attention_layernorm.weight", "model.layers.31.norm"},
      {"transformer.h.0.ln_1.weight", "transformer.h.0.norm"},
      {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn"},
      {"blocks.10.attn2.to_k.weight", "blocks.10.cross_attn"},
      {"blocks.1.attn1.to_q.weight", "blocks.1.attn"},
      {"blocks.1.encoder_attn.k.weight", "blocks.1.cross_attn"},
      {"blocks.1.ff.net.0.proj.weight", "blocks.1.ffn"},
      {"blocks.1.norm2.bias", "blocks.1.norm"},
      {"blocks.1.scale_shift_table", "blocks.1.other"},
      {"model.embed_tokens.weight", "model.embed_tokens.weight"},
      {"lm_head.weight", "lm_head.weight"},
  };
  for (const auto& [tensor, object] : cases) {
    EXPECT_EQ(grouper->ObjectNameFor(tensor), object) << tensor;
  }
  auto blocks = ObjectGrouper::Create(Grouping::kBlock, GroupingRules::Defaults());
  ASSERT_THAT(blocks, IsOk());
  EXPECT_EQ(blocks->ObjectNameFor("model.layers.3.mlp.up.weight"), "model.layers.3");
  EXPECT_EQ(blocks->ObjectNameFor("blocks.10.attn.q.weight"), "blocks.10");
}

// --- Object layout -------------------------------------------------------------------------------

TEST_F(CatalogTest, ContiguousObjectIsOneFileRange) {
  const std::vector<TensorSpec> specs = {
      RandomTensor("blocks.0.a", "F32", {10}, 1),  // 40 bytes
      RandomTensor("blocks.0.b", "BF16", {3}, 2),  // 6 bytes
      RandomTensor("blocks.1.a", "F32", {10}, 3),
  };
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  auto model = RegisterOneFile(*catalog, "m", specs);
  ASSERT_THAT(model, IsOk());
  const ObjectInfo* block0 = FindObject(**model, "blocks.0");
  ASSERT_NE(block0, nullptr);
  EXPECT_EQ(block0->size, 46u);
  ASSERT_EQ(block0->extents.size(), 1u);
  EXPECT_EQ(block0->extents[0].file, 0u);
  EXPECT_EQ(block0->extents[0].file_offset, DataStart(specs));
  EXPECT_EQ(block0->extents[0].length, 46u);
  EXPECT_EQ(block0->extents[0].object_offset, 0u);
  ASSERT_EQ(block0->tensors.size(), 2u);
  EXPECT_EQ(block0->tensors[0].offset, 0u);
  EXPECT_EQ(block0->tensors[1].offset, 40u);
  ExpectObjectsReproduceTensors(
      **model, {{"blocks.0.a", specs[0]}, {"blocks.0.b", specs[1]}, {"blocks.1.a", specs[2]}});
}

TEST_F(CatalogTest, InterleavedObjectIsGatheredAt256ByteOffsets) {
  const std::vector<TensorSpec> specs = {
      RandomTensor("blocks.0.a", "F32", {10}, 1),  // 40 bytes
      RandomTensor("blocks.1.a", "F32", {10}, 2),
      RandomTensor("blocks.0.b", "BF16", {3}, 3),  // 6 bytes
      RandomTensor("blocks.1.b", "BF16", {3}, 4),
  };
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  auto model = RegisterOneFile(*catalog, "m", specs);
  ASSERT_THAT(model, IsOk());
  const uint64_t start = DataStart(specs);
  for (int block = 0; block < 2; ++block) {
    SCOPED_TRACE(block);
    const ObjectInfo* object = FindObject(**model, absl::StrCat("blocks.", block));
    ASSERT_NE(object, nullptr);
    EXPECT_EQ(object->size, 256u + 6u);
    ASSERT_EQ(object->tensors.size(), 2u);
    EXPECT_EQ(object->tensors[0].offset, 0u);
    EXPECT_EQ(object->tensors[1].offset, 256u);
    ASSERT_EQ(object->extents.size(), 2u);
    EXPECT_EQ(object->extents[0].file_offset, start + 40u * block);
    EXPECT_EQ(object->extents[0].length, 40u);
    EXPECT_EQ(object->extents[0].object_offset, 0u);
    EXPECT_EQ(object->extents[1].file_offset, start + 80u + 6u * block);
    EXPECT_EQ(object->extents[1].length, 6u);
    EXPECT_EQ(object->extents[1].object_offset, 256u);
  }
  EXPECT_EQ((*model)->total_bytes, 2u * 262u);
}

TEST_F(CatalogTest, GatheredExtentsMergeWhenContiguousInFileAndObject) {
  const std::vector<TensorSpec> specs = {
      RandomTensor("blocks.0.a", "F32", {64}, 1),  // 256 bytes: b follows at an aligned offset
      RandomTensor("blocks.0.b", "F32", {64}, 2),
      RandomTensor("blocks.1.a", "F32", {4}, 3),
      RandomTensor("blocks.0.c", "F32", {4}, 4),
  };
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  auto model = RegisterOneFile(*catalog, "m", specs);
  ASSERT_THAT(model, IsOk());
  const ObjectInfo* block0 = FindObject(**model, "blocks.0");
  ASSERT_NE(block0, nullptr);
  const uint64_t start = DataStart(specs);
  ASSERT_EQ(block0->extents.size(), 2u);
  EXPECT_EQ(block0->extents[0].file_offset, start);
  EXPECT_EQ(block0->extents[0].length, 512u);
  EXPECT_EQ(block0->extents[0].object_offset, 0u);
  EXPECT_EQ(block0->extents[1].file_offset, start + 528u);
  EXPECT_EQ(block0->extents[1].length, 16u);
  EXPECT_EQ(block0->extents[1].object_offset, 512u);
  EXPECT_EQ(block0->size, 528u);
}

TEST_F(CatalogTest, ZeroSizeTensorsHavePlacementsButNoExtents) {
  const std::vector<TensorSpec> specs = {
      RandomTensor("blocks.0.a", "F32", {4}, 1),
      RandomTensor("blocks.0.empty", "F32", {0, 3}, 2),
      RandomTensor("blocks.0.b", "F32", {4}, 3),
      RandomTensor("nothing.bias", "F16", {0}, 4),
  };
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  auto model = RegisterOneFile(*catalog, "m", specs);
  ASSERT_THAT(model, IsOk());
  const ObjectInfo* block0 = FindObject(**model, "blocks.0");
  ASSERT_NE(block0, nullptr);
  EXPECT_EQ(block0->size, 32u);
  EXPECT_EQ(block0->extents.size(), 1u);
  EXPECT_THAT(TensorNames(*block0), ElementsAre("blocks.0.a", "blocks.0.empty", "blocks.0.b"));
  EXPECT_EQ(block0->tensors[1].size, 0u);
  const ObjectInfo* nothing = FindObject(**model, "nothing.bias");
  ASSERT_NE(nothing, nullptr);
  EXPECT_EQ(nothing->size, 0u);
  EXPECT_THAT(nothing->extents, IsEmpty());
  ASSERT_EQ(nothing->tensors.size(), 1u);
  EXPECT_EQ(nothing->tensors[0].size, 0u);
  std::map<std::string, TensorSpec> expected;
  for (const TensorSpec& spec : specs) expected[spec.name] = spec;
  ExpectObjectsReproduceTensors(**model, expected);
}

TEST_F(CatalogTest, CustomBlockPatternGroupsItsOwnNaming) {
  const std::vector<TensorSpec> specs = {
      RandomTensor("transformer_blocks.0.attn.to_q.weight", "F32", {4, 4}, 1),
      RandomTensor("transformer_blocks.0.ff.net.weight", "F32", {4, 4}, 2),
      RandomTensor("transformer_blocks.1.attn.to_q.weight", "F32", {4, 4}, 3),
      RandomTensor("transformer_blocks.12.ff.net.weight", "F32", {4, 4}, 4),
      RandomTensor("proj_out.weight", "F32", {4}, 5),
  };
  GroupingRules rules;
  rules.block_patterns = {R"(^(transformer_blocks\.\d+)\.)"};
  rules.phase_patterns = {{"attention", R"(^attn\.)"}};
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  auto blocks = RegisterOneFile(*catalog, "blocks", specs, Grouping::kBlock, rules);
  ASSERT_THAT(blocks, IsOk());
  EXPECT_THAT(ObjectNames(**blocks), ElementsAre("proj_out.weight", "transformer_blocks.0",
                                                 "transformer_blocks.1", "transformer_blocks.12"));
  auto phases = RegisterOneFile(*catalog, "phases", specs, Grouping::kPhase, rules);
  ASSERT_THAT(phases, IsOk());
  EXPECT_THAT(
      ObjectNames(**phases),
      ElementsAre("proj_out.weight", "transformer_blocks.0.attention", "transformer_blocks.0.other",
                  "transformer_blocks.1.attention", "transformer_blocks.12.other"));
}

TEST_F(CatalogTest, BadGroupingRulesAreRejected) {
  const std::vector<TensorSpec> specs = {RandomTensor("blocks.0.a", "F32", {4}, 1)};
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  GroupingRules unparsable;
  unparsable.block_patterns = {"(blocks"};
  EXPECT_THAT(RegisterOneFile(*catalog, "a", specs, Grouping::kBlock, unparsable),
              StatusIs(kInvalid));
  GroupingRules no_group;
  no_group.block_patterns = {R"(^blocks\.\d+\.)"};
  EXPECT_THAT(RegisterOneFile(*catalog, "b", specs, Grouping::kBlock, no_group),
              StatusIs(kInvalid));
  GroupingRules two_groups;
  two_groups.block_patterns = {R"(^(blocks)\.(\d+)\.)"};
  EXPECT_THAT(RegisterOneFile(*catalog, "c", specs, Grouping::kPhase, two_groups),
              StatusIs(kInvalid));
  GroupingRules bad_phase = GroupingRules::Defaults();
  bad_phase.phase_patterns.emplace_back("broken", "[a-");
  EXPECT_THAT(RegisterOneFile(*catalog, "d", specs, Grouping::kPhase, bad_phase),
              StatusIs(kInvalid));
  EXPECT_THAT(catalog->ListModels(), IsEmpty());
  EXPECT_THAT(CatalogDirectory(), IsEmpty());
}

}  // namespace
}  // namespace catalog_test
}  // namespace tierd
