// catalog_test's names and registration errors: model names, object keys and grouping names, what
// a failed lookup or registration says, relative directories, and dropping a model.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/storage/model/catalog_test_fixture.h"

namespace tierd {
namespace catalog_test {
namespace {

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

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

}  // namespace
}  // namespace catalog_test
}  // namespace tierd
