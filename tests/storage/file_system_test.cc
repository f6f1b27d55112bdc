// The file-system seam: the POSIX file system against real files in a temporary directory, the
// atomic replacement written on it, and the fault-injecting wrapper.
#include "storage/file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fault_injecting_file_system.h"
#include "storage/model_roots.h"
#include "storage/posix_file_system.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::ReadWholeFile;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

class FileSystemTest : public ::testing::Test {
 protected:
  std::string PathOf(const std::string& name) const { return absl::StrCat(dir_.path(), "/", name); }

  TempDir dir_;
  PosixFileSystem posix_;
};

TEST_F(FileSystemTest, WrittenBytesAreReadBackThroughTheDescriptors) {
  const std::string path = PathOf("f");
  {
    auto fd = posix_.OpenForWrite(path, OpenForWriteOptions());
    ASSERT_THAT(fd, IsOk());
    ASSERT_THAT(WriteAll(fd->get(), "hello", path), IsOk());
    ASSERT_THAT(posix_.SyncFile(fd->get(), path), IsOk());
  }
  struct stat info;
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  auto fd = posix_.OpenForRead(path, OpenForReadOptions());
  ASSERT_THAT(fd, IsOk());
  char buffer[8] = {};
  EXPECT_THAT(ReadUpTo(fd->get(), buffer, sizeof(buffer), path), testing::IsOkAndHolds(5u));
  EXPECT_EQ(std::string(buffer, 5), "hello");
}

TEST_F(FileSystemTest, OpeningAMissingFileIsNotFoundNamingIt) {
  const auto fd = posix_.OpenForRead(PathOf("missing"), OpenForReadOptions());
  EXPECT_THAT(fd, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(fd.status().message()), HasSubstr("missing"));
  EXPECT_THAT(posix_.RemoveFile(PathOf("missing")), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(FileSystemTest, AModelFileIsOpenedBeneathItsRootAndALinkIsRefused) {
  const std::string root = PathOf("root");
  ASSERT_THAT(posix_.CreateDirectories(root), IsOk());
  ASSERT_THAT(testing::WriteFile(absl::StrCat(root, "/real"), "bytes"), IsOk());
  ASSERT_EQ(::symlink("real", absl::StrCat(root, "/link").c_str()), 0);
  auto roots = ModelRoots::Create({root});
  ASSERT_THAT(roots, IsOk());
  OpenForReadOptions beneath;
  beneath.beneath = &*roots;
  const std::string resolved = roots->roots().front();
  EXPECT_THAT(posix_.OpenForRead(absl::StrCat(resolved, "/real"), beneath), IsOk());
  EXPECT_THAT(posix_.OpenForRead(absl::StrCat(resolved, "/link"), beneath),
              StatusIs(absl::StatusCode::kPermissionDenied));
  // Without `beneath` the link is an ordinary path.
  EXPECT_THAT(posix_.OpenForRead(absl::StrCat(resolved, "/link"), OpenForReadOptions()), IsOk());
}

TEST_F(FileSystemTest, DirectoriesAreCreatedAndListedSorted) {
  const std::string dir = PathOf("a/b/c");
  ASSERT_THAT(posix_.CreateDirectories(dir), IsOk());
  ASSERT_THAT(posix_.CreateDirectories(dir), IsOk());  // exists already: fine
  ASSERT_THAT(testing::WriteFile(absl::StrCat(dir, "/z"), ""), IsOk());
  ASSERT_THAT(testing::WriteFile(absl::StrCat(dir, "/y"), ""), IsOk());
  ASSERT_THAT(posix_.Rename(absl::StrCat(dir, "/z"), absl::StrCat(dir, "/x")), IsOk());
  const auto names = posix_.ListDirectory(dir);
  ASSERT_THAT(names, IsOk());
  EXPECT_THAT(*names, ElementsAre("x", "y"));
  EXPECT_THAT(posix_.SyncDirectory(dir), IsOk());
}

TEST_F(FileSystemTest, WriteFileAtomicallyReplacesTheFileAndLeavesNoTemporary) {
  const std::string path = PathOf("state.json");
  const std::string temporary = PathOf("state.json.tmp");
  ASSERT_THAT(testing::WriteFile(path, "old"), IsOk());
  const absl::string_view parts[] = {"new ", "contents"};
  ASSERT_THAT(WriteFileAtomically(posix_, path, temporary, parts, 0644), IsOk());
  EXPECT_EQ(ReadWholeFile(path), "new contents");
  EXPECT_FALSE(std::filesystem::exists(temporary));
}

TEST_F(FileSystemTest, AFailedAtomicWriteKeepsTheOldFileAndRemovesTheTemporary) {
  auto faults = std::make_shared<FaultInjectingFileSystem>();
  const std::string path = PathOf("state.json");
  const std::string temporary = PathOf("state.json.tmp");
  ASSERT_THAT(testing::WriteFile(path, "old"), IsOk());
  const absl::string_view parts[] = {"new"};
  faults->FailAlways(FileOperation::kSyncFile, "", EIO);
  EXPECT_THAT(WriteFileAtomically(*faults, path, temporary, parts, 0644),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(ReadWholeFile(path), "old");
  EXPECT_FALSE(std::filesystem::exists(temporary));
  faults->ClearFaults();
  faults->FailAlways(FileOperation::kWrite, "", ENOSPC);
  EXPECT_THAT(WriteFileAtomically(*faults, path, temporary, parts, 0644),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(ReadWholeFile(path), "old");
  EXPECT_FALSE(std::filesystem::exists(temporary));
}

TEST_F(FileSystemTest, FaultsApplyOnlyToTheChosenOperationAndPaths) {
  FaultInjectingFileSystem faults;
  ASSERT_THAT(testing::WriteFile(PathOf("chosen"), "x"), IsOk());
  ASSERT_THAT(testing::WriteFile(PathOf("other"), "x"), IsOk());
  faults.FailAlways(FileOperation::kOpenForRead, "chosen", EACCES);
  const auto refused = faults.OpenForRead(PathOf("chosen"), OpenForReadOptions());
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr(PathOf("chosen")));
  EXPECT_THAT(faults.OpenForRead(PathOf("other"), OpenForReadOptions()), IsOk());
  EXPECT_THAT(faults.OpenForWrite(PathOf("chosen"), OpenForWriteOptions()), IsOk());
  EXPECT_THAT(faults.BeforeRead(PathOf("chosen")), IsOk());
  EXPECT_EQ(faults.calls(FileOperation::kOpenForRead), 2u);
  EXPECT_EQ(faults.failures(FileOperation::kOpenForRead), 1u);
  faults.SetFault(FileOperation::kOpenForRead, nullptr);
  EXPECT_THAT(faults.OpenForRead(PathOf("chosen"), OpenForReadOptions()), IsOk());
}

TEST_F(FileSystemTest, ADirectOpenFaultLeavesBufferedOpensAlone) {
  FaultInjectingFileSystem faults;
  ASSERT_THAT(testing::WriteFile(PathOf("f"), "x"), IsOk());
  faults.FailAlways(FileOperation::kOpenDirect, "", EINVAL);
  OpenForReadOptions direct;
  direct.direct = true;
  EXPECT_THAT(faults.OpenForRead(PathOf("f"), direct),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(faults.OpenForRead(PathOf("f"), OpenForReadOptions()), IsOk());
}

TEST_F(FileSystemTest, ADeciderSeesEveryCallAndMayLetItThrough) {
  FaultInjectingFileSystem faults;
  auto seen = std::make_shared<std::vector<std::string>>();
  faults.SetFault(FileOperation::kRead, [seen](const std::string& path) {
    seen->push_back(path);
    return seen->size() == 2 ? EIO : 0;
  });
  EXPECT_THAT(faults.BeforeRead("a"), IsOk());
  EXPECT_THAT(faults.BeforeRead("b"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(faults.BeforeRead("c"), IsOk());
  EXPECT_THAT(*seen, ElementsAre("a", "b", "c"));
  EXPECT_EQ(faults.failures(FileOperation::kRead), 1u);
}

}  // namespace
}  // namespace tierd
