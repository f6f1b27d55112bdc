// model_scan on its own, on real files in a temporary directory: which files and tensors a model
// directory yields, what is refused, and the later check that a file is still the one recorded.
#include "storage/model/model_scan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::RandomTensor;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

class ModelScanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = absl::StrCat(dir_.path(), "/model");
    std::filesystem::create_directories(model_dir_);
  }

  std::string PathOf(const std::string& name) const { return absl::StrCat(model_dir_, "/", name); }

  TempDir dir_;
  std::string model_dir_;
};

TEST_F(ModelScanTest, EveryFileAndTensorIsFoundWithItsIdentity) {
  ASSERT_THAT(WriteSafetensors(PathOf("b.safetensors"), {RandomTensor("y", "F32", {8}, 2)}),
              IsOk());
  ASSERT_THAT(WriteSafetensors(PathOf("a.safetensors"),
                               {RandomTensor("x", "F16", {4}, 1), RandomTensor("z", "U8", {3}, 3)}),
              IsOk());
  ASSERT_THAT(testing::WriteFile(PathOf("README"), "not a model file"), IsOk());
  std::vector<std::string> progress;
  auto scanned = ScanModelDirectory(
      model_dir_, [&](const RegistrationProgress& p) { progress.push_back(p.current_file); });
  ASSERT_THAT(scanned, IsOk());
  ASSERT_EQ(scanned->files.size(), 2u);
  EXPECT_EQ(scanned->files[0].path, std::filesystem::canonical(PathOf("a.safetensors")).string());
  EXPECT_NE(scanned->files[0].inode, 0u);
  EXPECT_EQ(scanned->files[0].size, std::filesystem::file_size(PathOf("a.safetensors")));
  EXPECT_EQ(scanned->tensors.size(), 3u);
  EXPECT_EQ(progress.size(), 2u);
  for (const SourceTensor& tensor : scanned->tensors) {
    if (tensor.name == "y") {
      EXPECT_EQ(tensor.file, 1u);
      EXPECT_EQ(tensor.size(), 32u);
    }
  }
}

TEST_F(ModelScanTest, ADirectoryWithoutSafetensorsIsNotFound) {
  EXPECT_THAT(ScanModelDirectory(model_dir_, nullptr), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ScanModelDirectory(PathOf("absent"), nullptr), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ModelScanTest, MoreTensorsThanTheLimitAreRefused) {
  ASSERT_THAT(WriteSafetensors(PathOf("m.safetensors"),
                               {RandomTensor("a", "F32", {1}, 1), RandomTensor("b", "F32", {1}, 2),
                                RandomTensor("c", "F32", {1}, 3)}),
              IsOk());
  EXPECT_THAT(ScanModelDirectory(model_dir_, nullptr, ModelRoots(), 3), IsOk());
  EXPECT_THAT(ScanModelDirectory(model_dir_, nullptr, ModelRoots(), 2),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ModelScanTest, ATruncatedFileIsDataLoss) {
  ASSERT_THAT(WriteRawSafetensors(PathOf("m.safetensors"),
                                  SafetensorsHeaderJson({RandomTensor("a", "F32", {64}, 1)}),
                                  std::string(100, 'x')),
              IsOk());
  EXPECT_THAT(ScanModelDirectory(model_dir_, nullptr), StatusIs(absl::StatusCode::kDataLoss));
}

TEST_F(ModelScanTest, AFileChangedSinceTheScanFailsItsCheck) {
  ASSERT_THAT(WriteSafetensors(PathOf("m.safetensors"), {RandomTensor("a", "F32", {64}, 1)}),
              IsOk());
  auto scanned = ScanModelDirectory(model_dir_, nullptr);
  ASSERT_THAT(scanned, IsOk());
  const ModelFile recorded = scanned->files.at(0);
  EXPECT_EQ(DescribeChangedFile(scanned->files), "");
  {
    auto fd = OpenModelFile(ModelRoots(), recorded, O_RDONLY);
    ASSERT_THAT(fd, IsOk());
    EXPECT_THAT(CheckModelFile(fd->get(), recorded), IsOk());
  }
  // Grown by a byte: the recorded size no longer matches.
  {
    std::ofstream append(PathOf("m.safetensors"), std::ios::app | std::ios::binary);
    append.put('!');
  }
  const auto changed = OpenModelFile(ModelRoots(), recorded, O_RDONLY);
  EXPECT_THAT(changed, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(changed.status().message()), HasSubstr("changed size"));
  EXPECT_THAT(DescribeChangedFile(scanned->files), HasSubstr("m.safetensors"));
}

TEST_F(ModelScanTest, AModelOutsideTheRootsIsRefused) {
  const std::string root = absl::StrCat(dir_.path(), "/root");
  std::filesystem::create_directories(root);
  ASSERT_THAT(WriteSafetensors(PathOf("m.safetensors"), {RandomTensor("a", "F32", {4}, 1)}),
              IsOk());
  auto roots = ModelRoots::Create({root});
  ASSERT_THAT(roots, IsOk());
  EXPECT_THAT(ScanModelDirectory(model_dir_, nullptr, *roots),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

}  // namespace
}  // namespace tierd
