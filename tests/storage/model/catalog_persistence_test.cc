// catalog_test's persistence: models and checksums surviving a reopen, flushes, models whose files
// changed becoming stale, corrupt or leftover catalog files, and concurrent use.
#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/storage/model/catalog_test_fixture.h"

namespace tierd {
namespace catalog_test {
namespace {

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

// A catalog written before checksums were made of segments (format 1) holds checksums of whole
// objects: the same values for objects of one segment or less, kept; no longer the checksum of a
// larger object, dropped — its next read records one instead of failing — and the file is written
// again in the current format.
TEST_F(CatalogTest, AnOlderFormatsWholeObjectChecksumsOfLargeObjectsAreDropped) {
  {
    auto catalog = OpenCatalog();
    ASSERT_NE(catalog, nullptr);
    // blocks.1 is 6 MiB: over one segment.
    ASSERT_THAT(RegisterOneFile(*catalog, "m",
                                {RandomTensor("blocks.0.a", "F32", {4}, 1),
                                 RandomTensor("blocks.1.a", "F32", {3 << 19}, 2)}),
                IsOk());
    catalog->RecordChecksum("m/blocks.0", 0x0123456789abcdefull);
    catalog->RecordChecksum("m/blocks.1", 0x1111222233334444ull);
  }
  nlohmann::json older = nlohmann::json::parse(ReadWholeFile(CatalogFile("m")));
  ASSERT_EQ(older["format"], 2);
  ASSERT_EQ(older["checksums"].size(), 2u);
  older["format"] = 1;
  ASSERT_THAT(WriteFile(CatalogFile("m"), older.dump()), IsOk());

  auto catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  EXPECT_THAT(catalog->Lookup("m/blocks.1"), IsOk());
  EXPECT_EQ(catalog->Checksum("m/blocks.0"), 0x0123456789abcdefull);
  EXPECT_EQ(catalog->Checksum("m/blocks.1"), std::nullopt);
  ASSERT_THAT(catalog->Flush(), IsOk());
  const nlohmann::json rewritten = nlohmann::json::parse(ReadWholeFile(CatalogFile("m")));
  EXPECT_EQ(rewritten["format"], 2);
  EXPECT_EQ(rewritten["checksums"].dump(), R"({"blocks.0":"0123456789abcdef"})");
  // A format no daemon wrote is still refused.
  older["format"] = 3;
  ASSERT_THAT(WriteFile(CatalogFile("m"), older.dump()), IsOk());
  catalog.reset();
  catalog = OpenCatalog();
  ASSERT_NE(catalog, nullptr);
  EXPECT_THAT(catalog->ListModels(), IsEmpty());
  EXPECT_THAT(CatalogDirectory(), ElementsAre("m.json.corrupt"));
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

}  // namespace
}  // namespace catalog_test
}  // namespace tierd
