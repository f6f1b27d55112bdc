// catalog_test's sharded models: the files a model.safetensors.index.json names, and how an index
// or a shard that disagrees with the others is refused without registering anything.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/storage/model/catalog_test_fixture.h"

namespace tierd {
namespace catalog_test {
namespace {

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

}  // namespace
}  // namespace catalog_test
}  // namespace tierd
