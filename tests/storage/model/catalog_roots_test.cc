// catalog_test's model roots: registrations confined to --model-roots, model files opened beneath
// a root without following links (OpenBeneath, both ways the kernel allows), recorded file
// identities, the per-model tensor limit, and registration with --verify.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fd_io.h"
#include "storage/model/model_scan.h"
#include "storage/model/object_checksum.h"
#include "storage/model_roots.h"
#include "tests/storage/model/catalog_test_fixture.h"

namespace tierd {
namespace catalog_test {
namespace {

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
}  // namespace catalog_test
}  // namespace tierd
