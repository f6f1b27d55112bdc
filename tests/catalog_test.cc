#include "storage/catalog.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fd_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/model_roots.h"
#include "storage/model_scan.h"
#include "storage/object_checksum.h"
#include "storage/object_layout.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;
using ::tierd::testing::IsOk;
using ::tierd::testing::RandomTensor;
using ::tierd::testing::ReadWholeFile;
using ::tierd::testing::SafetensorsHeaderJson;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;
using ::tierd::testing::TensorSpec;
using ::tierd::testing::WriteFile;
using ::tierd::testing::WriteRawSafetensors;
using ::tierd::testing::WriteSafetensors;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kNotFound = absl::StatusCode::kNotFound;

// --- Helpers -------------------------------------------------------------------------------------

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::vector<std::string> ObjectNames(const ModelInfo& model) {
  std::vector<std::string> names;
  for (const ObjectInfo& object : model.objects) names.push_back(object.name);
  return names;
}

std::vector<std::string> TensorNames(const ObjectInfo& object) {
  std::vector<std::string> names;
  for (const TensorPlacement& tensor : object.tensors) names.push_back(tensor.name);
  return names;
}

// Where a tensor's data starts in a file written by WriteSafetensors(specs): just after the header.
uint64_t DataStart(const std::vector<TensorSpec>& specs) {
  return 8 + SafetensorsHeaderJson(specs).size();
}

// Everything about a model's layout, one fact per line, so two layouts compare with a readable
// diff.
std::string Describe(const ModelInfo& model) {
  std::string text = absl::StrCat("model ", model.name, " dir ", model.directory, " grouping ",
                                  GroupingName(model.grouping), " total ", model.total_bytes, "\n");
  for (const ModelFile& file : model.files) {
    absl::StrAppend(&text, "file ", file.path, " ", file.size, " ", file.mtime_ns, "\n");
  }
  for (const ObjectInfo& object : model.objects) {
    absl::StrAppend(&text, "object ", object.name, " ", object.size, "\n");
    for (const TensorPlacement& tensor : object.tensors) {
      absl::StrAppend(&text, "  tensor ", tensor.name, " ", DTypeName(tensor.dtype), " [");
      for (uint64_t dim : tensor.shape) absl::StrAppend(&text, dim, ",");
      absl::StrAppend(&text, "] @", tensor.offset, " +", tensor.size, "\n");
    }
    for (const Extent& extent : object.extents) {
      absl::StrAppend(&text, "  extent file ", extent.file, " @", extent.file_offset, " +",
                      extent.length, " -> ", extent.object_offset, "\n");
    }
  }
  return text;
}

// The key correctness property: reading an object's extents from its files into a buffer of the
// object's size puts every tensor's exact bytes at its placement. Also checks that every tensor in
// `expected` is in exactly one object, with its dtype and shape.
void ExpectObjectsReproduceTensors(const ModelInfo& model,
                                   const std::map<std::string, TensorSpec>& expected) {
  std::vector<int> fds;
  for (const ModelFile& file : model.files) {
    fds.push_back(open(file.path.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_GE(fds.back(), 0) << file.path;
  }
  std::multiset<std::string> seen;
  uint64_t total = 0;
  for (const ObjectInfo& object : model.objects) {
    SCOPED_TRACE(object.name);
    total += object.size;
    std::string buffer(object.size, '\xA5');
    for (const Extent& extent : object.extents) {
      ASSERT_LT(extent.file, fds.size());
      ASSERT_LE(extent.object_offset + extent.length, object.size);
      const ssize_t n = pread(fds[extent.file], buffer.data() + extent.object_offset, extent.length,
                              static_cast<off_t>(extent.file_offset));
      ASSERT_EQ(n, static_cast<ssize_t>(extent.length));
    }
    for (const TensorPlacement& tensor : object.tensors) {
      seen.insert(tensor.name);
      auto spec = expected.find(tensor.name);
      ASSERT_NE(spec, expected.end()) << "unexpected tensor " << tensor.name;
      EXPECT_EQ(DTypeName(tensor.dtype), spec->second.dtype) << tensor.name;
      EXPECT_EQ(tensor.shape, spec->second.shape) << tensor.name;
      ASSERT_EQ(tensor.size, spec->second.data.size()) << tensor.name;
      ASSERT_LE(tensor.offset + tensor.size, object.size) << tensor.name;
      EXPECT_TRUE(buffer.compare(tensor.offset, tensor.size, spec->second.data) == 0)
          << "bytes of " << tensor.name << " differ at object offset " << tensor.offset;
    }
  }
  for (int fd : fds) close(fd);
  EXPECT_EQ(total, model.total_bytes);
  for (const auto& [name, spec] : expected) {
    EXPECT_EQ(seen.count(name), 1u) << name << " should be in exactly one object";
  }
}

// A small DiT-like model. Each block has tensors of several phases and dtypes, with sizes that are
// and are not multiples of 256. Two files: the first holds embed.weight and blocks 0, 1, 10, 11
// and most of 2 in name order (so "blocks.1" and "blocks.10" sit next to each other), the second
// the rest in a shuffled order, plus blocks.2's ffn tensors (so blocks.2 spans both files).
struct DitModel {
  std::map<std::string, TensorSpec> tensors;  // by name
  std::map<std::string, std::string> phase;   // tensor → phase object suffix, for block tensors
  std::map<std::string, int> block;           // tensor → block number, for block tensors
};

DitModel WriteDitModel(const std::string& dir) {
  struct Part {
    const char* suffix;
    const char* dtype;
    std::vector<uint64_t> shape;
    const char* phase;
  };
  const std::vector<Part> parts = {
      {"attn.q.weight", "F32", {8, 8}, "attn"},              // 256 bytes
      {"attn.k.weight", "BF16", {8, 8}, "attn"},             // 128
      {"cross_attn.k.weight", "F16", {4, 8}, "cross_attn"},  // 64
      {"ffn.up.weight", "BF16", {16, 8}, "ffn"},             // 256
      {"ffn.down.weight", "F32", {8, 3}, "ffn"},             // 96
      {"norm1.weight", "F32", {8}, "norm"},                  // 32
      {"scale_shift_table", "F32", {6, 5}, "other"},         // 120
  };
  DitModel model;
  uint64_t seed = 1;
  std::vector<TensorSpec> first;
  std::vector<TensorSpec> second;
  const auto add = [&](TensorSpec spec, bool in_first) {
    model.tensors[spec.name] = spec;
    (in_first ? first : second).push_back(std::move(spec));
  };
  add(RandomTensor("embed.weight", "F32", {16, 8}, seed++), true);
  for (int n = 0; n < 12; ++n) {
    for (const Part& part : parts) {
      const std::string name = absl::StrCat("blocks.", n, ".", part.suffix);
      model.phase[name] = part.phase;
      model.block[name] = n;
      const bool in_first = n == 0 || n == 1 || n == 10 || n == 11 ||
                            (n == 2 && !absl::StartsWith(part.suffix, "ffn."));
      add(RandomTensor(name, part.dtype, part.shape, seed++), in_first);
    }
  }
  add(RandomTensor("head.weight", "BF16", {8, 16}, seed++), false);
  std::sort(first.begin(), first.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  std::shuffle(second.begin(), second.end(), std::mt19937(7));
  EXPECT_THAT(WriteSafetensors(dir + "/diffusion_pytorch_model-00001-of-00002.safetensors", first),
              IsOk());
  EXPECT_THAT(WriteSafetensors(dir + "/diffusion_pytorch_model-00002-of-00002.safetensors", second),
              IsOk());
  return model;
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

class CatalogTest : public ::testing::Test {
 protected:
  std::unique_ptr<Catalog> OpenCatalog() {
    auto catalog = Catalog::Open(state_.path());
    EXPECT_THAT(catalog, IsOk());
    return catalog.ok() ? *std::move(catalog) : nullptr;
  }

  // A directory under the test's model root.
  std::string ModelDir(const std::string& name) {
    const std::string dir = absl::StrCat(models_.path(), "/", name);
    std::filesystem::create_directories(dir);
    return dir;
  }

  std::string CatalogFile(const std::string& model) {
    return absl::StrCat(state_.path(), "/catalog/", model, ".json");
  }

  std::vector<std::string> CatalogDirectory() {
    std::vector<std::string> names;
    for (const auto& entry :
         std::filesystem::directory_iterator(absl::StrCat(state_.path(), "/catalog"))) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // Writes a one-file model of `specs` to a fresh directory and registers it.
  absl::StatusOr<std::shared_ptr<const ModelInfo>> RegisterOneFile(
      Catalog& catalog, const std::string& name, const std::vector<TensorSpec>& specs,
      Grouping grouping = Grouping::kBlock,
      const GroupingRules& rules = GroupingRules::Defaults()) {
    const std::string dir = ModelDir(name);
    EXPECT_THAT(WriteSafetensors(dir + "/model.safetensors", specs), IsOk());
    auto summary = catalog.RegisterModel(name, dir, grouping, rules);
    if (!summary.ok()) return summary.status();
    return catalog.GetModel(name);
  }

  TempDir state_;
  TempDir models_;
};

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

// --- Sharded models and the index ----------------------------------------------------------------

class CatalogIndexTest : public CatalogTest {
 protected:
  // Two shards: a and b in the first, c in the second.
  void SetUp() override {
    dir_ = ModelDir("sharded");
    a_ = RandomTensor("layers.0.a", "F32", {8}, 1);
    b_ = RandomTensor("layers.1.b", "BF16", {8}, 2);
    c_ = RandomTensor("layers.0.c", "F16", {8}, 3);
    ASSERT_THAT(WriteSafetensors(dir_ + "/model-00001-of-00002.safetensors", {a_, b_}), IsOk());
    ASSERT_THAT(WriteSafetensors(dir_ + "/model-00002-of-00002.safetensors", {c_}), IsOk());
    catalog_ = OpenCatalog();
    ASSERT_NE(catalog_, nullptr);
  }

  void WriteIndex(const nlohmann::json& weight_map) {
    const nlohmann::json index = {{"metadata", {{"total_size", 48}}}, {"weight_map", weight_map}};
    ASSERT_THAT(WriteFile(dir_ + "/model.safetensors.index.json", index.dump()), IsOk());
  }

  absl::StatusOr<ModelSummary> Register() {
    return catalog_->RegisterModel("sharded", dir_, Grouping::kBlock, GroupingRules::Defaults());
  }

  const std::string first_ = "model-00001-of-00002.safetensors";
  const std::string second_ = "model-00002-of-00002.safetensors";
  std::string dir_;
  TensorSpec a_, b_, c_;
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(CatalogIndexTest, IndexedModelUsesExactlyTheFilesItNames) {
  WriteIndex({{"layers.0.a", first_}, {"layers.1.b", first_}, {"layers.0.c", second_}});
  // Not in the index, so not part of the model, even though it would not parse.
  ASSERT_THAT(WriteRawSafetensors(dir_ + "/stray.safetensors", "garbage", ""), IsOk());
  auto summary = Register();
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->files, 2u);
  auto model = catalog_->GetModel("sharded");
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ((*model)->files[1].path, dir_ + "/" + second_);
  EXPECT_THAT(ObjectNames(**model), ElementsAre("layers.0", "layers.1"));
  EXPECT_THAT(TensorNames(*FindObject(**model, "layers.0")),
              ElementsAre("layers.0.a", "layers.0.c"));
  ExpectObjectsReproduceTensors(**model, {{a_.name, a_}, {b_.name, b_}, {c_.name, c_}});
}

TEST_F(CatalogIndexTest, IndexNamingAPathInsteadOfAFileIsRejected) {
  for (const std::string& file : {std::string("../sharded/") + second_, "sub/" + second_,
                                  std::string(".."), "/etc/" + second_}) {
    SCOPED_TRACE(file);
    WriteIndex({{"layers.0.a", first_}, {"layers.1.b", first_}, {"layers.0.c", file}});
    auto summary = Register();
    EXPECT_THAT(summary, StatusIs(kInvalid));
    EXPECT_THAT(summary.status().message(), HasSubstr("layers.0.c"));
  }
  EXPECT_THAT(catalog_->ListModels(), IsEmpty());
}

TEST_F(CatalogIndexTest, IndexLeavingOutATensorIsRejected) {
  WriteIndex({{"layers.0.a", first_}, {"layers.0.c", second_}});
  auto summary = Register();
  EXPECT_THAT(summary, StatusIs(kInvalid));
  EXPECT_THAT(summary.status().message(), HasSubstr("layers.1.b"));
  EXPECT_THAT(summary.status().message(), HasSubstr(first_));
}

TEST_F(CatalogIndexTest, IndexPlacingATensorInTheWrongFileIsRejected) {
  WriteIndex({{"layers.0.a", first_}, {"layers.1.b", second_}, {"layers.0.c", second_}});
  auto summary = Register();
  EXPECT_THAT(summary, StatusIs(kInvalid));
  EXPECT_THAT(summary.status().message(), HasSubstr("layers.1.b"));
  EXPECT_THAT(summary.status().message(), HasSubstr(first_));
  EXPECT_THAT(summary.status().message(), HasSubstr(second_));
}

TEST_F(CatalogIndexTest, IndexListingATensorNoFileHoldsIsRejected) {
  WriteIndex({{"layers.0.a", first_},
              {"layers.1.b", first_},
              {"layers.0.c", second_},
              {"layers.9.ghost", second_}});
  auto summary = Register();
  EXPECT_THAT(summary, StatusIs(kInvalid));
  EXPECT_THAT(summary.status().message(), HasSubstr("layers.9.ghost"));
}

TEST_F(CatalogIndexTest, IndexNamingAMissingFileIsNotFound) {
  WriteIndex({{"layers.0.a", first_}, {"layers.1.b", "model-00003-of-00002.safetensors"}});
  EXPECT_THAT(Register(), StatusIs(kNotFound));
}

TEST_F(CatalogIndexTest, MalformedIndexIsRejected) {
  for (const std::string& text :
       {std::string("{\"weight_map\": "), std::string("[1, 2]"), std::string("{\"weight_map\": 3}"),
        std::string("{\"weight_map\": {\"layers.0.a\": 7}}"), std::string("{\"weight_map\": {}}"),
        std::string(100000, '[')}) {
    SCOPED_TRACE(text.substr(0, 40));
    ASSERT_THAT(WriteFile(dir_ + "/model.safetensors.index.json", text), IsOk());
    EXPECT_THAT(Register(), StatusIs(kInvalid));
  }
}

TEST_F(CatalogIndexTest, TensorInTwoFilesIsRejectedNamingBoth) {
  ASSERT_THAT(
      WriteSafetensors(dir_ + "/" + second_, {c_, RandomTensor("layers.0.a", "F32", {8}, 9)}),
      IsOk());
  auto summary = Register();
  EXPECT_THAT(summary, StatusIs(kInvalid));
  EXPECT_THAT(summary.status().message(), HasSubstr("layers.0.a"));
  EXPECT_THAT(summary.status().message(), HasSubstr(first_));
  EXPECT_THAT(summary.status().message(), HasSubstr(second_));
}

TEST_F(CatalogIndexTest, MalformedSecondFileRegistersNothing) {
  ASSERT_THAT(WriteRawSafetensors(dir_ + "/" + second_, "{this is not json", "data"), IsOk());
  std::vector<RegistrationProgress> progress;
  auto summary =
      catalog_->RegisterModel("sharded", dir_, Grouping::kBlock, GroupingRules::Defaults(),
                              [&](const RegistrationProgress& p) { progress.push_back(p); });
  EXPECT_THAT(summary, StatusIs(kInvalid));
  EXPECT_THAT(summary.status().message(), HasSubstr(second_));
  EXPECT_EQ(progress.size(), 1u);
  EXPECT_THAT(catalog_->ListModels(), IsEmpty());
  EXPECT_THAT(catalog_->Lookup("sharded/layers.0"), StatusIs(kNotFound));
  EXPECT_THAT(CatalogDirectory(), IsEmpty());
  // Nothing half-registered blocks a retry once the file is fixed.
  ASSERT_THAT(WriteSafetensors(dir_ + "/" + second_, {c_}), IsOk());
  EXPECT_THAT(Register(), IsOk());
}

TEST_F(CatalogIndexTest, ProgressIsReportedOncePerFileInOrder) {
  ASSERT_THAT(WriteSafetensors(dir_ + "/model-00003.safetensors",
                               {RandomTensor("layers.2.d", "F32", {2}, 4)}),
              IsOk());
  std::vector<RegistrationProgress> progress;
  ASSERT_THAT(
      catalog_->RegisterModel("sharded", dir_, Grouping::kBlock, GroupingRules::Defaults(),
                              [&](const RegistrationProgress& p) { progress.push_back(p); }),
      IsOk());
  ASSERT_EQ(progress.size(), 3u);
  const std::string files[] = {first_, second_, "model-00003.safetensors"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(progress[i].files_done, i + 1);
    EXPECT_EQ(progress[i].files_total, 3u);
    EXPECT_EQ(progress[i].current_file, dir_ + "/" + files[i]);
  }
}

// --- Names, keys and registration errors ---------------------------------------------------------

TEST(CatalogNamesTest, ModelNamesAreValidated) {
  for (const std::string& good : {std::string("m"), std::string("Wan2.1-T2V_14B"),
                                  std::string(128, 'x'), std::string("a..b")}) {
    EXPECT_THAT(ValidateModelName(good), IsOk()) << good;
  }
  for (const std::string& bad :
       {std::string(), std::string(129, 'x'), std::string(".hidden"), std::string("a/b"),
        std::string("a b"), std::string("ü"), std::string("..")}) {
    EXPECT_THAT(ValidateModelName(bad), StatusIs(kInvalid)) << bad;
  }
}

TEST(CatalogNamesTest, KeysSplitAtTheFirstSlash) {
  auto split = SplitObjectKey("m/blocks.3/ffn.up.weight");
  ASSERT_THAT(split, IsOk());
  EXPECT_EQ(split->first, "m");
  EXPECT_EQ(split->second, "blocks.3/ffn.up.weight");
  for (const char* bad : {"", "m", "/x", "m/", ".m/x", "a b/x", "/"}) {
    EXPECT_THAT(SplitObjectKey(bad), StatusIs(kInvalid)) << bad;
  }
}

TEST(CatalogNamesTest, GroupingNamesRoundTrip) {
  for (Grouping grouping : {Grouping::kTensor, Grouping::kBlock, Grouping::kPhase}) {
    EXPECT_EQ(ParseGrouping(GroupingName(grouping)), grouping);
  }
  EXPECT_EQ(ParseGrouping("layer"), std::nullopt);
}

TEST_F(CatalogTest, LookupErrorsSayWhatIsWrong) {
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  ASSERT_THAT(RegisterOneFile(*catalog, "m", {RandomTensor("blocks.0.a", "F32", {4}, 1)}), IsOk());
  EXPECT_THAT(catalog->Lookup("m/blocks.0"), IsOk());
  EXPECT_THAT(catalog->Lookup("m/blocks.1"), StatusIs(kNotFound));
  EXPECT_THAT(catalog->Lookup("other/blocks.0"), StatusIs(kNotFound));
  EXPECT_THAT(catalog->Lookup("m"), StatusIs(kInvalid));
  EXPECT_THAT(catalog->Lookup("m/"), StatusIs(kInvalid));
  EXPECT_THAT(catalog->Lookup("/blocks.0"), StatusIs(kInvalid));
  EXPECT_THAT(catalog->GetModel("other"), StatusIs(kNotFound));
}

TEST_F(CatalogTest, RegisteringATakenNameFails) {
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  ASSERT_THAT(RegisterOneFile(*catalog, "m", {RandomTensor("blocks.0.a", "F32", {4}, 1)}), IsOk());
  EXPECT_THAT(
      catalog->RegisterModel("m", ModelDir("m"), Grouping::kTensor, GroupingRules::Defaults()),
      StatusIs(absl::StatusCode::kAlreadyExists));
  auto model = catalog->GetModel("m");
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ((*model)->grouping, Grouping::kBlock);
}

TEST_F(CatalogTest, RegisteringFromNothingIsNotFound) {
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  EXPECT_THAT(catalog->RegisterModel("m", models_.path() + "/missing", Grouping::kBlock,
                                     GroupingRules::Defaults()),
              StatusIs(kNotFound));
  const std::string empty = ModelDir("empty");
  ASSERT_THAT(WriteFile(empty + "/README.md", "no weights here"), IsOk());
  std::filesystem::create_directories(empty + "/nested.safetensors");
  EXPECT_THAT(catalog->RegisterModel("m", empty, Grouping::kBlock, GroupingRules::Defaults()),
              StatusIs(kNotFound));
  EXPECT_THAT(
      catalog->RegisterModel("bad name", empty, Grouping::kBlock, GroupingRules::Defaults()),
      StatusIs(kInvalid));
}

TEST_F(CatalogTest, RelativeDirectoryIsRecordedAbsolute) {
  const std::string dir = ModelDir("rel");
  ASSERT_THAT(WriteSafetensors(dir + "/model.safetensors", {RandomTensor("x", "F32", {4}, 1)}),
              IsOk());
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(models_.path());
  auto summary =
      catalog->RegisterModel("m", "./rel/", Grouping::kTensor, GroupingRules::Defaults());
  std::filesystem::current_path(cwd);
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->directory, dir);
  auto model = catalog->GetModel("m");
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ((*model)->files[0].path, dir + "/model.safetensors");
}

TEST_F(CatalogTest, DropModelForgetsItAndDeletesItsFile) {
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  const std::vector<TensorSpec> specs = {RandomTensor("blocks.0.a", "F32", {4}, 1)};
  ASSERT_THAT(RegisterOneFile(*catalog, "m", specs), IsOk());
  ASSERT_TRUE(Exists(CatalogFile("m")));
  ASSERT_THAT(catalog->DropModel("m"), IsOk());
  EXPECT_FALSE(Exists(CatalogFile("m")));
  EXPECT_THAT(catalog->ListModels(), IsEmpty());
  EXPECT_THAT(catalog->Lookup("m/blocks.0"), StatusIs(kNotFound));
  EXPECT_THAT(catalog->DropModel("m"), StatusIs(kNotFound));
  EXPECT_THAT(catalog->DropModel("../catalog/x"), StatusIs(kNotFound));
  // The name is free again.
  EXPECT_THAT(
      catalog->RegisterModel("m", ModelDir("m"), Grouping::kTensor, GroupingRules::Defaults()),
      IsOk());
  catalog.reset();
  catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  EXPECT_THAT(catalog->Lookup("m/blocks.0.a"), IsOk());
}

// --- Persistence ---------------------------------------------------------------------------------

TEST_F(CatalogTest, ReopenedCatalogHasTheSameModels) {
  const std::string dir = ModelDir("dit");
  const DitModel dit = WriteDitModel(dir);
  std::string before;
  {
    auto catalog = OpenCatalog();
    ASSERT_NE(catalog, nullptr);
    ASSERT_THAT(catalog->RegisterModel("dit", dir, Grouping::kPhase, GroupingRules::Defaults()),
                IsOk());
    ASSERT_THAT(
        RegisterOneFile(*catalog, "small", {RandomTensor("w", "F64", {3}, 1)}, Grouping::kTensor),
        IsOk());
    before = Describe(**catalog->GetModel("dit"));
  }
  EXPECT_THAT(CatalogDirectory(), ElementsAre("dit.json", "small.json"));
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  const auto models = catalog->ListModels();
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].name, "dit");
  EXPECT_EQ(models[0].grouping, Grouping::kPhase);
  EXPECT_EQ(models[0].tensors, dit.tensors.size());
  EXPECT_EQ(models[1].name, "small");
  auto model = catalog->GetModel("dit");
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ(Describe(**model), before);
  ExpectObjectsReproduceTensors(**model, dit.tensors);
  EXPECT_THAT(catalog->Lookup("small/w"), IsOk());
}

TEST_F(CatalogTest, ChecksumSurvivesDestructionAndReopen) {
  {
    auto catalog = OpenCatalog();
    ASSERT_NE(catalog, nullptr);
    ASSERT_THAT(RegisterOneFile(*catalog, "m", {RandomTensor("blocks.0.a", "F32", {4}, 1)}),
                IsOk());
    EXPECT_EQ(catalog->Checksum("m/blocks.0"), std::nullopt);
    catalog->RecordChecksum("m/blocks.0", 0x0123456789abcdefull);
    EXPECT_EQ(catalog->Checksum("m/blocks.0"), 0x0123456789abcdefull);
  }
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  EXPECT_EQ(catalog->Checksum("m/blocks.0"), 0x0123456789abcdefull);
  EXPECT_THAT(ReadWholeFile(CatalogFile("m")), HasSubstr("0123456789abcdef"));
}

TEST_F(CatalogTest, FlushPersistsChecksumsImmediately) {
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  ASSERT_THAT(RegisterOneFile(*catalog, "m", {RandomTensor("blocks.0.a", "F32", {4}, 1)}), IsOk());
  catalog->RecordChecksum("m/blocks.0", 0xfedcba9876543210ull);
  ASSERT_THAT(catalog->Flush(), IsOk());
  // A second catalog sees only what is on disk.
  auto reader = OpenCatalog();
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->Checksum("m/blocks.0"), 0xfedcba9876543210ull);
}

TEST_F(CatalogTest, BackgroundFlushPersistsChecksumsWithinSeconds) {
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  ASSERT_THAT(RegisterOneFile(*catalog, "m", {RandomTensor("blocks.0.a", "F32", {4}, 1)}), IsOk());
  catalog->RecordChecksum("m/blocks.0", 0x00000000deadbeefull);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!absl::StrContains(ReadWholeFile(CatalogFile("m")), "00000000deadbeef") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(ReadWholeFile(CatalogFile("m")), HasSubstr("00000000deadbeef"));
}

TEST_F(CatalogTest, ChecksumForAGoneModelOrObjectIsIgnored) {
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  ASSERT_THAT(RegisterOneFile(*catalog, "m", {RandomTensor("blocks.0.a", "F32", {4}, 1)}), IsOk());
  catalog->RecordChecksum("m/blocks.0", 1);
  ASSERT_THAT(catalog->DropModel("m"), IsOk());
  catalog->RecordChecksum("m/blocks.0", 2);
  catalog->RecordChecksum("other/blocks.0", 3);
  catalog->RecordChecksum("not a key", 4);
  EXPECT_EQ(catalog->Checksum("m/blocks.0"), std::nullopt);
  ASSERT_THAT(catalog->Flush(), IsOk());
  catalog.reset();
  // Neither the flush nor the destructor brought the dropped model's file back.
  EXPECT_THAT(CatalogDirectory(), IsEmpty());
}

TEST_F(CatalogTest, ModelWhoseFileChangedSizeIsStaleAfterReopen) {
  const std::string dir = ModelDir("m");
  {
    auto catalog = OpenCatalog();
    ASSERT_NE(catalog, nullptr);
    ASSERT_THAT(RegisterOneFile(*catalog, "m", {RandomTensor("blocks.0.a", "F32", {4}, 1)}),
                IsOk());
  }
  ASSERT_THAT(
      WriteSafetensors(dir + "/model.safetensors", {RandomTensor("blocks.0.a", "F32", {8}, 1)}),
      IsOk());
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  auto lookup = catalog->Lookup("m/blocks.0");
  EXPECT_THAT(lookup, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(lookup.status().message(), HasSubstr(dir + "/model.safetensors"));
  EXPECT_THAT(lookup.status().message(), HasSubstr("re-register"));
  ASSERT_EQ(catalog->ListModels().size(), 1u);
  EXPECT_EQ(catalog->ListModels()[0].name, "m");
  // Dropping and registering again is the way out.
  ASSERT_THAT(catalog->DropModel("m"), IsOk());
  ASSERT_THAT(catalog->RegisterModel("m", dir, Grouping::kBlock, GroupingRules::Defaults()),
              IsOk());
  auto fresh = catalog->Lookup("m/blocks.0");
  ASSERT_THAT(fresh, IsOk());
  EXPECT_EQ(fresh->object->size, 32u);
}

TEST_F(CatalogTest, ModelWhoseFileWasTouchedIsStaleAfterReopen) {
  const std::string dir = ModelDir("m");
  {
    auto catalog = OpenCatalog();
    ASSERT_NE(catalog, nullptr);
    ASSERT_THAT(RegisterOneFile(*catalog, "m", {RandomTensor("blocks.0.a", "F32", {4}, 1)}),
                IsOk());
  }
  // Same size, later mtime: the bytes may differ, so the recorded offsets cannot be trusted.
  struct stat st {};
  ASSERT_EQ(stat((dir + "/model.safetensors").c_str(), &st), 0);
  const timespec times[2] = {st.st_atim, {st.st_mtim.tv_sec + 10, st.st_mtim.tv_nsec}};
  ASSERT_EQ(utimensat(AT_FDCWD, (dir + "/model.safetensors").c_str(), times, 0), 0);
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  EXPECT_THAT(catalog->Lookup("m/blocks.0"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(catalog->ListModels().size(), 1u);
}

TEST_F(CatalogTest, CorruptCatalogFileIsSetAsideAndTheRestLoad) {
  {
    auto catalog = OpenCatalog();
    ASSERT_NE(catalog, nullptr);
    for (const char* name : {"bad", "good", "lying", "renamed"}) {
      ASSERT_THAT(RegisterOneFile(*catalog, name, {RandomTensor("blocks.0.a", "F32", {4}, 1)}),
                  IsOk());
    }
  }
  ASSERT_THAT(WriteFile(CatalogFile("bad"), "{\"format\": 1, \"name\": "), IsOk());
  // Valid JSON, but an extent past the end of its file: reading it would fail or lie.
  nlohmann::json lying = nlohmann::json::parse(ReadWholeFile(CatalogFile("lying")));
  lying["objects"][0]["extents"][0][2] = 1u << 30;
  ASSERT_THAT(WriteFile(CatalogFile("lying"), lying.dump()), IsOk());
  // A file whose name disagrees with the model inside it.
  std::filesystem::rename(CatalogFile("renamed"), CatalogFile("other"));

  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  const auto models = catalog->ListModels();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].name, "good");
  EXPECT_THAT(catalog->Lookup("good/blocks.0"), IsOk());
  EXPECT_THAT(CatalogDirectory(), ElementsAre("bad.json.corrupt", "good.json", "lying.json.corrupt",
                                              "other.json.corrupt"));
  // The name of a set-aside model can be registered again.
  EXPECT_THAT(RegisterOneFile(*catalog, "bad", {RandomTensor("blocks.0.a", "F32", {4}, 1)}),
              IsOk());
}

TEST_F(CatalogTest, LeftoverTemporaryFileIsRemovedOnOpen) {
  std::filesystem::create_directories(state_.path() + "/catalog");
  ASSERT_THAT(WriteFile(state_.path() + "/catalog/m.json.tmp", "{\"half\": "), IsOk());
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  EXPECT_THAT(catalog->ListModels(), IsEmpty());
  EXPECT_THAT(CatalogDirectory(), IsEmpty());
}

// --- Concurrency ---------------------------------------------------------------------------------

TEST_F(CatalogTest, ConcurrentLookupsChecksumsAndRegistrationsAgree) {
  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  const std::string dir = ModelDir("shared");
  ASSERT_THAT(
      WriteSafetensors(dir + "/model.safetensors", {RandomTensor("blocks.0.a", "F32", {4}, 1),
                                                    RandomTensor("blocks.1.a", "F32", {4}, 2)}),
      IsOk());
  ASSERT_THAT(catalog->RegisterModel("stable", dir, Grouping::kBlock, GroupingRules::Defaults()),
              IsOk());
  std::atomic<bool> stop{false};
  std::atomic<int> registered{0};
  std::vector<std::thread> threads;
  // Two threads race to register and drop the same name: exactly one registration can win each
  // round, and the other sees ALREADY_EXISTS or NOT_FOUND, never a torn state.
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto summary =
            catalog->RegisterModel("churn", dir, Grouping::kBlock, GroupingRules::Defaults());
        if (summary.ok()) ++registered;
        const absl::Status dropped = catalog->DropModel("churn");
        EXPECT_TRUE(dropped.ok() || dropped.code() == kNotFound) << dropped;
      }
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      uint64_t value = static_cast<uint64_t>(t) << 32;
      while (!stop.load()) {
        auto ref = catalog->Lookup("stable/blocks.1");
        ASSERT_THAT(ref, IsOk());
        ASSERT_EQ(ref->object->tensors.size(), 1u);
        catalog->RecordChecksum("stable/blocks.1", ++value);
        EXPECT_NE(catalog->Checksum("stable/blocks.1"), std::nullopt);
        catalog->RecordChecksum("churn/blocks.0", value);
      }
    });
  }
  threads[0].join();
  threads[1].join();
  stop = true;
  threads[2].join();
  threads[3].join();
  EXPECT_GT(registered.load(), 0);
  ASSERT_THAT(catalog->Flush(), IsOk());
  const std::optional<uint64_t> last = catalog->Checksum("stable/blocks.1");
  catalog.reset();
  EXPECT_THAT(CatalogDirectory(), ElementsAre("stable.json"));
  catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  EXPECT_EQ(catalog->Checksum("stable/blocks.1"), last);
}

// --- Model roots ---------------------------------------------------------------------------------

class ModelRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(dir_.path(), "/models");
    outside_ = absl::StrCat(dir_.path(), "/elsewhere");
    for (const std::string& model :
         {absl::StrCat(root_, "/good"), absl::StrCat(outside_, "/secret")}) {
      std::filesystem::create_directories(model);
      ASSERT_THAT(WriteSafetensors(absl::StrCat(model, "/model.safetensors"),
                                   {RandomTensor("blocks.0.w", "F32", {4, 4}, 1)}),
                  IsOk());
    }
    auto roots = ModelRoots::Create({root_});
    ASSERT_THAT(roots, IsOk());
    auto catalog = Catalog::Open(absl::StrCat(dir_.path(), "/state"), *std::move(roots));
    ASSERT_THAT(catalog, IsOk());
    catalog_ = *std::move(catalog);
  }

  absl::Status Register(const std::string& name, const std::string& directory) {
    return catalog_->RegisterModel(name, directory, Grouping::kBlock, GroupingRules::Defaults())
        .status();
  }

  TempDir dir_;
  std::string root_;
  std::string outside_;
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(ModelRootsTest, ADirectoryInsideARootIsRegistered) {
  EXPECT_THAT(Register("good", absl::StrCat(root_, "/good")), IsOk());
}

TEST_F(ModelRootsTest, ADirectoryOutsideIsRefusedWithoutReadingIt) {
  const absl::Status status = Register("secret", absl::StrCat(outside_, "/secret"));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(status.message()), HasSubstr("outside --model-roots"));
  EXPECT_EQ(catalog_->model_count(), 0u);
}

TEST_F(ModelRootsTest, DotDotIsRefusedEvenWhenItWouldLandInside) {
  EXPECT_THAT(Register("dots", absl::StrCat(root_, "/good/../good")), StatusIs(kInvalid));
  EXPECT_THAT(Register("dots", absl::StrCat(root_, "/../elsewhere/secret")), StatusIs(kInvalid));
}

TEST_F(ModelRootsTest, SymlinksThatEscapeAreRefused) {
  // A directory link inside the root that points outside it.
  const std::string link = absl::StrCat(root_, "/link");
  ASSERT_EQ(::symlink(absl::StrCat(outside_, "/secret").c_str(), link.c_str()), 0);
  const absl::Status status = Register("link", link);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(status.message()), HasSubstr("which resolves to"));
  // A file link inside a directory that is itself inside the root.
  const std::string mixed = absl::StrCat(root_, "/mixed");
  std::filesystem::create_directories(mixed);
  ASSERT_EQ(::symlink(absl::StrCat(outside_, "/secret/model.safetensors").c_str(),
                      absl::StrCat(mixed, "/model.safetensors").c_str()),
            0);
  EXPECT_THAT(Register("mixed", mixed), StatusIs(absl::StatusCode::kPermissionDenied));
  // A link that stays inside the root is fine.
  const std::string inner = absl::StrCat(root_, "/inner");
  ASSERT_EQ(::symlink(absl::StrCat(root_, "/good").c_str(), inner.c_str()), 0);
  EXPECT_THAT(Register("inner", inner), IsOk());
  EXPECT_EQ(catalog_->model_count(), 1u);
}

TEST_F(ModelRootsTest, RootsMustBeAbsoluteDirectories) {
  EXPECT_THAT(ModelRoots::Create({"models"}), StatusIs(kInvalid));
  EXPECT_THAT(ModelRoots::Create({absl::StrCat(dir_.path(), "/absent")}), StatusIs(kInvalid));
  EXPECT_THAT(ModelRoots::Create({absl::StrCat(root_, "/good/model.safetensors")}),
              StatusIs(kInvalid));
  // A prefix of a root's name is not inside it.
  auto roots = ModelRoots::Create({absl::StrCat(root_, "/go")}).status();
  EXPECT_THAT(roots, StatusIs(kInvalid));  // no such directory
  std::filesystem::create_directories(absl::StrCat(root_, "/go"));
  auto go = ModelRoots::Create({absl::StrCat(root_, "/go")});
  ASSERT_THAT(go, IsOk());
  EXPECT_THAT(go->Check(absl::StrCat(root_, "/good")),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

// Registration records a model file resolved; every later open follows no link and cannot leave
// the root, whichever way the kernel lets it be done.
class OpenBeneathTest : public ModelRootsTest,
                        public ::testing::WithParamInterface<SymlinkFreeOpen> {
 protected:
  absl::StatusOr<ScopedFd> Open(const std::string& relative) {
    ScopedFd root(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (root.get() < 0) return absl::InternalError("cannot open the root");
    return OpenWithoutSymlinks(root.get(), relative, O_RDONLY, relative, GetParam());
  }
};

TEST_P(OpenBeneathTest, ARegularFileIsOpened) {
  EXPECT_THAT(Open("good/model.safetensors"), IsOk());
  EXPECT_THAT(Open("./good//model.safetensors"), IsOk());
  EXPECT_THAT(Open("good/absent.safetensors"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_P(OpenBeneathTest, ALinkAnywhereOnThePathIsRefused) {
  // A file link to outside the root, a file link inside it, a directory link: all refused, though
  // the second and third lead to files inside the root.
  ASSERT_EQ(::symlink(absl::StrCat(outside_, "/secret/model.safetensors").c_str(),
                      absl::StrCat(root_, "/good/out.safetensors").c_str()),
            0);
  ASSERT_EQ(::symlink("model.safetensors", absl::StrCat(root_, "/good/in.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink("good", absl::StrCat(root_, "/alias").c_str()), 0);
  for (const char* path :
       {"good/out.safetensors", "good/in.safetensors", "alias/model.safetensors"}) {
    const absl::StatusOr<ScopedFd> opened = Open(path);
    EXPECT_THAT(opened, StatusIs(absl::StatusCode::kPermissionDenied)) << path;
    EXPECT_THAT(std::string(opened.status().message()), HasSubstr("symbolic link")) << path;
  }
  EXPECT_THAT(Open("good/../good/model.safetensors"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

INSTANTIATE_TEST_SUITE_P(Kernel, OpenBeneathTest,
                         ::testing::Values(SymlinkFreeOpen::kAuto, SymlinkFreeOpen::kWalk),
                         [](const ::testing::TestParamInfo<SymlinkFreeOpen>& info) {
                           return info.param == SymlinkFreeOpen::kAuto ? std::string("Openat2")
                                                                       : std::string("Walk");
                         });

TEST_F(ModelRootsTest, FilesAreRecordedResolvedWithTheirIdentity) {
  // Model snapshots are links to blobs: the blob is what is recorded, and later opened.
  const std::string snapshot = absl::StrCat(root_, "/snapshot");
  std::filesystem::create_directories(snapshot);
  ASSERT_EQ(
      ::symlink("../good/model.safetensors", absl::StrCat(snapshot, "/model.safetensors").c_str()),
      0);
  ASSERT_THAT(Register("snap", snapshot), IsOk());
  auto model = catalog_->GetModel("snap");
  ASSERT_THAT(model, IsOk());
  ASSERT_EQ((*model)->files.size(), 1u);
  const ModelFile& file = (*model)->files[0];
  EXPECT_EQ(file.path, absl::StrCat(root_, "/good/model.safetensors"));
  struct stat st {};
  ASSERT_EQ(::stat(file.path.c_str(), &st), 0);
  EXPECT_EQ(file.device, static_cast<uint64_t>(st.st_dev));
  EXPECT_EQ(file.inode, static_cast<uint64_t>(st.st_ino));
  EXPECT_THAT(OpenModelFile(catalog_->roots(), file, O_RDONLY), IsOk());
}

TEST_F(ModelRootsTest, AReplacedFileIsRefusedAtOpenEvenWithItsSizeAndMtime) {
  ASSERT_THAT(Register("good", absl::StrCat(root_, "/good")), IsOk());
  const ModelFile file = (*catalog_->GetModel("good"))->files[0];
  // Another file of the same size and mtime renamed over it: only the inode tells.
  const std::string other = absl::StrCat(root_, "/other.safetensors");
  ASSERT_THAT(WriteSafetensors(other, {RandomTensor("blocks.0.w", "F32", {4, 4}, 2)}), IsOk());
  const timespec times[2] = {{0, UTIME_OMIT},
                             {file.mtime_ns / 1000000000, file.mtime_ns % 1000000000}};
  ASSERT_EQ(::utimensat(AT_FDCWD, other.c_str(), times, 0), 0);
  ASSERT_EQ(::rename(other.c_str(), file.path.c_str()), 0);
  const absl::StatusOr<ScopedFd> opened = OpenModelFile(catalog_->roots(), file, O_RDONLY);
  EXPECT_THAT(opened, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("was replaced"));
  // And after a restart the model is stale for the same reason.
  catalog_.reset();
  auto reopened = Catalog::Open(absl::StrCat(dir_.path(), "/state"), *ModelRoots::Create({root_}));
  ASSERT_THAT(reopened, IsOk());
  EXPECT_THAT((*reopened)->Lookup("good/blocks.0"),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(ModelRootsTest, ACatalogWithoutIdentitiesGetsThemOnLoad) {
  ASSERT_THAT(Register("good", absl::StrCat(root_, "/good")), IsOk());
  catalog_.reset();
  // A catalog file as written before devices and inodes were recorded.
  const std::string path = absl::StrCat(dir_.path(), "/state/catalog/good.json");
  nlohmann::json doc = nlohmann::json::parse(ReadWholeFile(path));
  for (nlohmann::json& file : doc["files"]) {
    file.erase("device");
    file.erase("inode");
  }
  ASSERT_THAT(WriteFile(path, doc.dump(1)), IsOk());
  auto reopened = Catalog::Open(absl::StrCat(dir_.path(), "/state"), *ModelRoots::Create({root_}));
  ASSERT_THAT(reopened, IsOk());
  EXPECT_THAT((*reopened)->Lookup("good/blocks.0"), IsOk());
  EXPECT_NE((*(*reopened)->GetModel("good"))->files[0].inode, 0u);
  ASSERT_THAT((*reopened)->Flush(), IsOk());
  EXPECT_TRUE(nlohmann::json::parse(ReadWholeFile(path))["files"][0].contains("inode"));
}

TEST_F(ModelRootsTest, AFifoNamedAsAModelFileIsRefusedWithoutBlocking) {
  const std::string model = absl::StrCat(root_, "/fifo");
  std::filesystem::create_directories(model);
  // Listing the directory passes over what is not a regular file; an index names one anyway.
  const std::string fifo = absl::StrCat(model, "/model.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_THAT(WriteFile(absl::StrCat(model, "/model.safetensors.index.json"),
                        R"({"weight_map": {"blocks.0.w": "model.safetensors"}})"),
              IsOk());
  auto registration = std::async(std::launch::async, [&] { return Register("fifo", model); });
  const bool answered = registration.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!answered) {
    // Unblock the registration's open so the test can end, then fail.
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
  }
  EXPECT_TRUE(answered) << "opening the FIFO blocked the registration";
  EXPECT_THAT(registration.get(), StatusIs(kInvalid));
}

TEST(CatalogLimitsTest, AModelWithMoreTensorsThanTheLimitIsRefused) {
  TempDir dir;
  const std::string model = absl::StrCat(dir.path(), "/model");
  std::filesystem::create_directories(model);
  ASSERT_THAT(WriteSafetensors(absl::StrCat(model, "/a.safetensors"),
                               {RandomTensor("blocks.0.w", "F32", {4}, 1),
                                RandomTensor("blocks.1.w", "F32", {4}, 2)}),
              IsOk());
  ASSERT_THAT(WriteSafetensors(absl::StrCat(model, "/b.safetensors"),
                               {RandomTensor("blocks.2.w", "F32", {4}, 3),
                                RandomTensor("blocks.3.w", "F32", {4}, 4)}),
              IsOk());
  // The limit is per model, across its files.
  auto catalog = Catalog::Open(absl::StrCat(dir.path(), "/state"), ModelRoots(), 3);
  ASSERT_THAT(catalog, IsOk());
  const absl::Status refused =
      (*catalog)->RegisterModel("m", model, Grouping::kBlock, GroupingRules::Defaults()).status();
  EXPECT_THAT(refused, StatusIs(kInvalid));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("more than 3 tensors"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("--max-tensors-per-model"));
  auto roomy = Catalog::Open(absl::StrCat(dir.path(), "/state2"), ModelRoots(), 4);
  ASSERT_THAT(roomy, IsOk());
  EXPECT_THAT((*roomy)->RegisterModel("m", model, Grouping::kBlock, GroupingRules::Defaults()),
              IsOk());
}

TEST(CatalogVerifyTest, AVerifiedRegistrationRecordsEveryObjectsChecksum) {
  TempDir dir;
  const std::string model = absl::StrCat(dir.path(), "/model");
  std::filesystem::create_directories(model);
  // Block 0 is gathered (its tensors are apart in the file, 1000 bytes each: gaps between them).
  const std::vector<TensorSpec> tensors = {RandomTensor("blocks.0.a", "F32", {250}, 1),
                                           RandomTensor("blocks.1.a", "F32", {250}, 2),
                                           RandomTensor("blocks.0.b", "F32", {250}, 3)};
  ASSERT_THAT(WriteSafetensors(absl::StrCat(model, "/model.safetensors"), tensors), IsOk());
  auto catalog = Catalog::Open(absl::StrCat(dir.path(), "/state"));
  ASSERT_THAT(catalog, IsOk());
  std::vector<RegistrationProgress> progress;
  ASSERT_THAT((*catalog)->RegisterModel(
                  "m", model, Grouping::kBlock, GroupingRules::Defaults(),
                  [&progress](const RegistrationProgress& p) { progress.push_back(p); }, true),
              IsOk());
  ASSERT_FALSE(progress.empty());
  EXPECT_GT(progress.back().bytes_to_verify, 0u);
  EXPECT_EQ(progress.back().bytes_verified, progress.back().bytes_to_verify);
  auto info = (*catalog)->GetModel("m");
  ASSERT_THAT(info, IsOk());
  ASSERT_EQ((*info)->objects.size(), 2u);
  for (const ObjectInfo& object : (*info)->objects) {
    // The checksum of the object's bytes as the host cache assembles them: gaps zeroed.
    std::string bytes(object.size, '\x55');
    const std::string file = ReadWholeFile((*info)->files[0].path);
    for (const Extent& extent : object.extents) {
      bytes.replace(extent.object_offset, extent.length, file, extent.file_offset, extent.length);
    }
    ZeroObjectGaps(object, reinterpret_cast<uint8_t*>(bytes.data()));
    const std::optional<uint64_t> recorded = (*catalog)->Checksum(absl::StrCat("m/", object.name));
    ASSERT_TRUE(recorded.has_value()) << object.name;
    EXPECT_EQ(*recorded,
              ObjectChecksum(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()))
        << object.name;
  }
  // Persisted with the registration.
  catalog->reset();
  auto reopened = Catalog::Open(absl::StrCat(dir.path(), "/state"));
  ASSERT_THAT(reopened, IsOk());
  EXPECT_TRUE((*reopened)->Checksum("m/blocks.0").has_value());
  EXPECT_TRUE((*reopened)->Checksum("m/blocks.1").has_value());
}

}  // namespace
}  // namespace tierd
