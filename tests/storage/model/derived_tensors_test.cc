// Derived tensors (storage/model/derived_tensors.h) end to end on real files: a checkpoint of
// per-expert tensors in two files registered with fused parameters as transformers builds them,
// read by a real disk reader into the host cache and compared with the stacking and concatenation
// done by hand; an expert as a shard of the fused object; renames, a zero-size tensor, one
// expert; the layout surviving a reopen of the catalog; every malformed spec refused by name.
#include "storage/model/derived_tensors.h"

#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/model/catalog.h"
#include "tests/storage/host/host_cache_test_fixture.h"

namespace tierd {
namespace host_cache_test {
namespace {

constexpr uint64_t kExperts = 4;
constexpr uint64_t kIntermediate = 6;
constexpr uint64_t kHidden = 8;
constexpr uint64_t kF32 = 4;

std::string Expert(uint64_t e, const char* projection) {
  return absl::StrCat("model.layers.0.mlp.experts.", e, ".", projection, ".weight");
}

DerivedTensorSpec Spec(std::string name, std::vector<uint64_t> shape,
                       std::vector<TensorRange> ranges) {
  return DerivedTensorSpec{std::move(name), DType::kF32, std::move(shape), std::move(ranges)};
}

TensorRange Whole(const std::string& tensor, uint64_t bytes) {
  return TensorRange{tensor, 0, bytes};
}

// A model's objects, one fact per line.
std::string DescribeObjects(const ModelInfo& model) {
  std::string text;
  for (const ObjectInfo& object : model.objects) {
    absl::StrAppend(&text, "object ", object.name, " ", object.size, "\n");
    for (const TensorPlacement& tensor : object.tensors) {
      absl::StrAppend(&text, "  tensor ", tensor.name, " ", DTypeName(tensor.dtype), " ",
                      tensor.shape.size(), "d @", tensor.offset, " +", tensor.size, "\n");
    }
    for (const Extent& extent : object.extents) {
      absl::StrAppend(&text, "  extent ", extent.file, " @", extent.file_offset, " +",
                      extent.length, " -> ", extent.object_offset, "\n");
    }
  }
  return text;
}

class DerivedTensorsTest : public HostCacheTest {
 protected:
  static constexpr uint64_t kProjectionBytes = kIntermediate * kHidden * kF32;

  // Experts' gate and up projections in one file, their down projections, the router and an
  // attention weight in another, as a sharded checkpoint spreads them.
  void WriteCheckpoint(uint64_t experts = kExperts) {
    model_dir_ = absl::StrCat(dir_.path(), "/models/moe");
    std::filesystem::create_directories(model_dir_);
    std::vector<testing::TensorSpec> first;
    std::vector<testing::TensorSpec> second;
    uint64_t seed = 1;
    for (uint64_t e = 0; e < experts; ++e) {
      first.push_back(
          testing::RandomTensor(Expert(e, "gate_proj"), "F32", {kIntermediate, kHidden}, seed++));
      first.push_back(
          testing::RandomTensor(Expert(e, "up_proj"), "F32", {kIntermediate, kHidden}, seed++));
      second.push_back(
          testing::RandomTensor(Expert(e, "down_proj"), "F32", {kHidden, kIntermediate}, seed++));
    }
    second.push_back(testing::RandomTensor("model.layers.0.block_sparse_moe.gate.weight", "F32",
                                           {experts, kHidden}, seed++));
    second.push_back(testing::RandomTensor("model.layers.0.self_attn.q_proj.weight", "F32",
                                           {kHidden, kHidden}, seed++));
    second.push_back(
        testing::RandomTensor("model.layers.0.old_empty.weight", "F32", {0, kHidden}, seed++));
    for (const auto& tensor : first) data_[tensor.name] = tensor.data;
    for (const auto& tensor : second) data_[tensor.name] = tensor.data;
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/model-1.safetensors"), first),
                IsOk());
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/model-2.safetensors"), second),
                IsOk());
  }

  // What transformers' MergeModulelist(dim=0) + Concatenate(dim=1) and MergeModulelist(dim=0)
  // make of the experts, and its rename of the router.
  std::vector<DerivedTensorSpec> FusedSpecs(uint64_t experts = kExperts) {
    std::vector<TensorRange> gate_up;
    std::vector<TensorRange> down;
    for (uint64_t e = 0; e < experts; ++e) {
      gate_up.push_back(Whole(Expert(e, "gate_proj"), kProjectionBytes));
      gate_up.push_back(Whole(Expert(e, "up_proj"), kProjectionBytes));
      down.push_back(Whole(Expert(e, "down_proj"), kProjectionBytes));
    }
    return {Spec("model.layers.0.mlp.experts.gate_up_proj", {experts, 2 * kIntermediate, kHidden},
                 gate_up),
            Spec("model.layers.0.mlp.experts.down_proj", {experts, kHidden, kIntermediate}, down),
            Spec("model.layers.0.mlp.gate.weight", {experts, kHidden},
                 {Whole("model.layers.0.block_sparse_moe.gate.weight", experts * kHidden * kF32)}),
            Spec("model.layers.0.mlp.experts.empty", {0, kHidden},
                 {TensorRange{"model.layers.0.old_empty.weight", 0, 0}})};
  }

  // torch.cat of the checkpoint tensors' bytes in this order: what a derived tensor must hold.
  std::string Concatenated(const std::vector<std::string>& tensors) const {
    std::string bytes;
    for (const std::string& tensor : tensors) bytes += data_.at(tensor);
    return bytes;
  }

  std::string FetchBytes(const std::string& key) {
    absl::StatusOr<HostObject> object = FetchNow(key);
    EXPECT_THAT(object, IsOk()) << key;
    if (!object.ok()) return "";
    return std::string(reinterpret_cast<const char*>(object->data()), object->size());
  }

  // The bytes of tensor `name` inside the object `key`, by its placement.
  std::string TensorIn(const std::string& key, const std::string& name) {
    absl::StatusOr<ObjectRef> ref = catalog_->Lookup(key);
    EXPECT_THAT(ref, IsOk()) << key;
    if (!ref.ok()) return "";
    for (const TensorPlacement& tensor : ref->object->tensors) {
      if (tensor.name == name) return FetchBytes(key).substr(tensor.offset, tensor.size);
    }
    ADD_FAILURE() << name << " is not in " << key;
    return "";
  }

  absl::Status Register(const std::string& name, Grouping grouping,
                        const std::vector<DerivedTensorSpec>& derived) {
    return catalog_
        ->RegisterModel(name, model_dir_, grouping, GroupingRules::Defaults(), nullptr, false,
                        derived)
        .status();
  }

  std::map<std::string, std::string> data_;
};

TEST_F(DerivedTensorsTest, AFusedParameterHoldsTheStackedAndConcatenatedExperts) {
  Start(8);
  WriteCheckpoint();
  ASSERT_THAT(Register("m", Grouping::kTensor, FusedSpecs()), IsOk());
  std::vector<std::string> gate_up;
  std::vector<std::string> down;
  for (uint64_t e = 0; e < kExperts; ++e) {
    gate_up.push_back(Expert(e, "gate_proj"));
    gate_up.push_back(Expert(e, "up_proj"));
    down.push_back(Expert(e, "down_proj"));
  }
  EXPECT_EQ(FetchBytes("m/model.layers.0.mlp.experts.gate_up_proj"), Concatenated(gate_up));
  EXPECT_EQ(FetchBytes("m/model.layers.0.mlp.experts.down_proj"), Concatenated(down));
  EXPECT_EQ(FetchBytes("m/model.layers.0.mlp.gate.weight"),
            data_.at("model.layers.0.block_sparse_moe.gate.weight"));
  EXPECT_EQ(FetchBytes("m/model.layers.0.self_attn.q_proj.weight"),
            data_.at("model.layers.0.self_attn.q_proj.weight"));
  // Each expert of a fused parameter is a shard along its first dimension: its gate and up.
  for (uint64_t e = 0; e < kExperts; ++e) {
    EXPECT_EQ(
        FetchBytes(absl::StrCat("m/model.layers.0.mlp.experts.gate_up_proj@0:", e, "/", kExperts)),
        Concatenated({Expert(e, "gate_proj"), Expert(e, "up_proj")}))
        << "expert " << e;
    EXPECT_EQ(
        FetchBytes(absl::StrCat("m/model.layers.0.mlp.experts.down_proj@0:", e, "/", kExperts)),
        data_.at(Expert(e, "down_proj")));
  }
  // The tensors the derived ones were made of are no longer the model's.
  EXPECT_THAT(catalog_->Lookup("m/" + Expert(0, "gate_proj")),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(catalog_->Lookup("m/model.layers.0.block_sparse_moe.gate.weight"),
              StatusIs(absl::StatusCode::kNotFound));
  // A zero-size derived tensor is an empty object, and the zero-size tensor it names is replaced.
  absl::StatusOr<ObjectRef> empty = catalog_->Lookup("m/model.layers.0.mlp.experts.empty");
  ASSERT_THAT(empty, IsOk());
  EXPECT_EQ(empty->object->size, 0u);
  EXPECT_THAT(catalog_->Lookup("m/model.layers.0.old_empty.weight"),
              StatusIs(absl::StatusCode::kNotFound));
  std::vector<ModelSummary> models = catalog_->ListModels();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].derived_tensors, 4u);
  EXPECT_EQ(models[0].tensors, 5u);
}

TEST_F(DerivedTensorsTest, InABlockTheFusedParametersAreGatheredWithTheRest) {
  Start(8);
  WriteCheckpoint();
  ASSERT_THAT(Register("m", Grouping::kBlock, FusedSpecs()), IsOk());
  absl::StatusOr<ObjectRef> block = catalog_->Lookup("m/model.layers.0");
  ASSERT_THAT(block, IsOk());
  EXPECT_EQ(block->object->tensors.size(), 5u);
  std::vector<std::string> gate_up;
  for (uint64_t e = 0; e < kExperts; ++e) {
    gate_up.push_back(Expert(e, "gate_proj"));
    gate_up.push_back(Expert(e, "up_proj"));
  }
  EXPECT_EQ(TensorIn("m/model.layers.0", "model.layers.0.mlp.experts.gate_up_proj"),
            Concatenated(gate_up));
  EXPECT_EQ(TensorIn("m/model.layers.0", "model.layers.0.self_attn.q_proj.weight"),
            data_.at("model.layers.0.self_attn.q_proj.weight"));
  // The block reads each range of the files once, in file order.
  const std::vector<Extent>& extents = block->object->extents;
  for (size_t i = 1; i < extents.size(); ++i) {
    EXPECT_LT(std::tie(extents[i - 1].file, extents[i - 1].file_offset),
              std::tie(extents[i].file, extents[i].file_offset));
  }
}

TEST_F(DerivedTensorsTest, OneExpertAndTheLayoutSurviveAReopen) {
  Start(8);
  WriteCheckpoint(/*experts=*/1);
  ASSERT_THAT(Register("m", Grouping::kTensor, FusedSpecs(1)), IsOk());
  EXPECT_EQ(FetchBytes("m/model.layers.0.mlp.experts.gate_up_proj@0:0/1"),
            Concatenated({Expert(0, "gate_proj"), Expert(0, "up_proj")}));
  // A catalog of its own, closed and opened again: the derived layout is read back as it was.
  const std::string state = absl::StrCat(dir_.path(), "/reopened");
  std::string before;
  {
    auto catalog = Catalog::Open(state);
    ASSERT_THAT(catalog, IsOk());
    ASSERT_THAT((*catalog)->RegisterModel("m", model_dir_, Grouping::kBlock,
                                          GroupingRules::Defaults(), nullptr, false, FusedSpecs(1)),
                IsOk());
    auto model = (*catalog)->GetModel("m");
    ASSERT_THAT(model, IsOk());
    before = DescribeObjects(**model);
  }
  auto catalog = Catalog::Open(state);
  ASSERT_THAT(catalog, IsOk());
  auto model = (*catalog)->GetModel("m");
  ASSERT_THAT(model, IsOk());
  EXPECT_EQ(DescribeObjects(**model), before);
  EXPECT_EQ((*model)->derived_tensors, 4u);
}

TEST_F(DerivedTensorsTest, AMalformedSpecIsRefusedByNameAndRegistersNothing) {
  Start(8);
  WriteCheckpoint();
  const std::string gate = Expert(0, "gate_proj");
  const std::string up = Expert(0, "up_proj");
  struct Case {
    const char* why;
    DerivedTensorSpec spec;
    const char* message;
  };
  const Case cases[] = {
      {"unknown source", Spec("x", {2}, {TensorRange{"model.nothing", 0, 8}}),
       "is not a tensor of the checkpoint"},
      {"past the end",
       Spec("x", {kIntermediate * kHidden}, {TensorRange{gate, 8, kProjectionBytes}}), "past its"},
      {"empty range", Spec("x", {0}, {TensorRange{gate, 0, 0}}), "are empty"},
      {"too few bytes", Spec("x", {2 * kIntermediate * kHidden}, {Whole(gate, kProjectionBytes)}),
       "its ranges hold"},
      // Ranges past the shape whose lengths add up, modulo 2^64, to the shape's bytes.
      {"lengths that wrap around",
       Spec("x", {kIntermediate * kHidden},
            {Whole(gate, kProjectionBytes), TensorRange{up, 0, 8},
             TensorRange{Expert(0, "down_proj"), 0, ~uint64_t{0} - 7}}),
       "hold more than"},
      {"a byte twice",
       Spec("x", {2 * kIntermediate * kHidden},
            {Whole(gate, kProjectionBytes), Whole(gate, kProjectionBytes)}),
       "overlap"},
      {"another dtype",
       DerivedTensorSpec{
           "x", DType::kBF16, {2 * kIntermediate * kHidden}, {Whole(gate, kProjectionBytes)}},
       "changes values"},
      {"a name left in place", Spec(up, {kIntermediate * kHidden}, {Whole(gate, kProjectionBytes)}),
       "name is taken"},
      {"no name", Spec("", {kIntermediate * kHidden}, {Whole(gate, kProjectionBytes)}),
       "has no name"},
      {"a name longer than a checkpoint's",
       Spec(std::string(4097, 'n'), {kIntermediate * kHidden}, {Whole(gate, kProjectionBytes)}),
       "longer than 4096"},
      {"more dimensions than a checkpoint's",
       Spec("x", std::vector<uint64_t>(65, 1), {TensorRange{gate, 0, 4}}), "more than 64"},
      {"dimensions whose product overflows beside a zero",
       Spec("x", {(uint64_t{1} << 63) + 1, 2, 4, 0}, {}), "overflows"},
  };
  for (const Case& c : cases) {
    absl::Status status = Register("m", Grouping::kTensor, {c.spec});
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument)) << c.why;
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr(c.message)) << c.why;
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("derived tensor")) << c.why;
  }
  // Two specs taking the same bytes, and two with one name.
  EXPECT_THAT(Register("m", Grouping::kTensor,
                       {Spec("a", {kIntermediate * kHidden}, {Whole(gate, kProjectionBytes)}),
                        Spec("b", {kIntermediate * kHidden}, {Whole(gate, kProjectionBytes)})}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Register("m", Grouping::kTensor,
                       {Spec("a", {kIntermediate * kHidden}, {Whole(gate, kProjectionBytes)}),
                        Spec("a", {kIntermediate * kHidden}, {Whole(up, kProjectionBytes)})}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(catalog_->ListModels().empty());
}

}  // namespace
}  // namespace host_cache_test
}  // namespace tierd
