// The fixture of catalog_test: a catalog over a state directory and a model root, the helpers that
// check a registered model's objects against the tensors written, and a small DiT-like model.
#ifndef TIERD_TESTS_STORAGE_MODEL_CATALOG_TEST_FIXTURE_H_
#define TIERD_TESTS_STORAGE_MODEL_CATALOG_TEST_FIXTURE_H_

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/model/catalog.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace catalog_test {

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

inline constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
inline constexpr absl::StatusCode kNotFound = absl::StatusCode::kNotFound;

inline std::vector<std::string> ObjectNames(const ModelInfo& model) {
  std::vector<std::string> names;
  for (const ObjectInfo& object : model.objects) names.push_back(object.name);
  return names;
}

inline std::vector<std::string> TensorNames(const ObjectInfo& object) {
  std::vector<std::string> names;
  for (const TensorPlacement& tensor : object.tensors) names.push_back(tensor.name);
  return names;
}

// The key correctness property: reading an object's extents from its files into a buffer of the
// object's size puts every tensor's exact bytes at its placement. Also checks that every tensor in
// `expected` is in exactly one object, with its dtype and shape.
inline void ExpectObjectsReproduceTensors(const ModelInfo& model,
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

inline DitModel WriteDitModel(const std::string& dir) {
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

}  // namespace catalog_test
}  // namespace tierd

#endif  // TIERD_TESTS_STORAGE_MODEL_CATALOG_TEST_FIXTURE_H_
