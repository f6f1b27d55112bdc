// A mixture of experts served to a C++ model server through a real daemon process: the checkpoint's
// per-expert tensors registered as the fused parameters transformers builds
// (Client::RegisterModel with RegisterModelRequest.derived), and the experts a router chose
// fetched with FetchMany as shards of the fused objects, one step per layer, each the bytes of
// torch.cat of the expert's gate and up projections (and its down projection).
#include "tests/system/api_test_fixture.h"

namespace tierd {
namespace api_test {
namespace {

constexpr uint64_t kExperts = 4;
constexpr uint64_t kLayers = 2;
constexpr uint64_t kIntermediate = 8;
constexpr uint64_t kHidden = 16;
constexpr uint64_t kProjectionBytes = kIntermediate * kHidden * 4;  // F32

std::string Projection(uint64_t layer, uint64_t expert, const char* name) {
  return absl::StrCat("model.layers.", layer, ".mlp.experts.", expert, ".", name, ".weight");
}

std::string Fused(uint64_t layer, const char* name) {
  return absl::StrCat("model.layers.", layer, ".mlp.experts.", name);
}

v1::TensorRange* AddWhole(v1::DerivedTensor& tensor, const std::string& source) {
  v1::TensorRange* range = tensor.add_ranges();
  range->set_tensor(source);
  range->set_length(kProjectionBytes);
  return range;
}

TEST_F(ApiTest, AModelServerFetchesTheExpertsItsRouterChoseAsShardsOfFusedParameters) {
  std::vector<testing::TensorSpec> tensors;
  std::map<std::string, std::string> bytes;
  v1::RegisterModelRequest request;
  request.set_name("moe");
  request.set_directory(model_dir("moe"));
  request.set_grouping(v1::GROUPING_TENSOR);
  for (uint64_t layer = 0; layer < kLayers; ++layer) {
    v1::DerivedTensor& gate_up = *request.add_derived();
    gate_up.set_name(Fused(layer, "gate_up_proj"));
    gate_up.set_dtype("F32");
    for (uint64_t dim : {kExperts, 2 * kIntermediate, kHidden}) gate_up.add_shape(dim);
    v1::DerivedTensor& down = *request.add_derived();
    down.set_name(Fused(layer, "down_proj"));
    down.set_dtype("F32");
    for (uint64_t dim : {kExperts, kHidden, kIntermediate}) down.add_shape(dim);
    for (uint64_t e = 0; e < kExperts; ++e) {
      for (const char* name : {"gate_proj", "up_proj", "down_proj"}) {
        const bool is_down = std::string(name) == "down_proj";
        tensors.push_back(testing::RandomTensor(Projection(layer, e, name), "F32",
                                                is_down
                                                    ? std::vector<uint64_t>{kHidden, kIntermediate}
                                                    : std::vector<uint64_t>{kIntermediate, kHidden},
                                                700 + tensors.size()));
        bytes[tensors.back().name] = tensors.back().data;
        AddWhole(is_down ? down : gate_up, Projection(layer, e, name));
      }
    }
  }
  ::mkdir(model_dir("moe").c_str(), 0755);
  ASSERT_THAT(testing::WriteSafetensors(model_dir("moe") + "/model.safetensors", tensors), IsOk());
  auto summary = client_->RegisterModel(request);
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->derived_tensors(), 2 * kLayers);

  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  Stream& stream = (*session)->default_stream();
  // The router chose expert 2 in layer 0 and expert 0 in layer 1: one step each, the layer
  // before released in the same write.
  std::vector<Lease> held;
  for (const auto& [layer, expert] : {std::pair<uint64_t, uint64_t>{0, 2}, {1, 0}}) {
    const std::string shard = absl::StrCat("@0:", expert, "/", kExperts);
    auto leases = (*session)->FetchMany(
        {"moe/" + Fused(layer, "gate_up_proj") + shard, "moe/" + Fused(layer, "down_proj") + shard},
        stream, std::move(held));
    ASSERT_THAT(leases, IsOk());
    ASSERT_EQ(leases->size(), 2u);
    EXPECT_EQ(Bytes(**session, (*leases)[0]), bytes.at(Projection(layer, expert, "gate_proj")) +
                                                  bytes.at(Projection(layer, expert, "up_proj")))
        << "layer " << layer;
    EXPECT_EQ(Bytes(**session, (*leases)[1]), bytes.at(Projection(layer, expert, "down_proj")));
    const v1::TensorInfo& tensor = (*leases)[0].tensors().at(0);
    EXPECT_EQ(std::vector<uint64_t>(tensor.shape().begin(), tensor.shape().end()),
              (std::vector<uint64_t>{1, 2 * kIntermediate, kHidden}));
    held = *std::move(leases);
  }
  ASSERT_THAT((*session)->FetchMany({}, stream, std::move(held)), IsOk());

  // A derived tensor naming a tensor the checkpoint lacks is refused, and nothing registered.
  request.set_name("bad");
  request.mutable_derived(0)->mutable_ranges(0)->set_tensor("model.layers.9.nothing.weight");
  EXPECT_THAT(client_->RegisterModel(request), StatusIs(absl::StatusCode::kInvalidArgument));
  auto models = client_->ListModels();
  ASSERT_THAT(models, IsOk());
  for (const v1::ModelSummary& model : *models) EXPECT_NE(model.name(), "bad");
}

}  // namespace
}  // namespace api_test
}  // namespace tierd
