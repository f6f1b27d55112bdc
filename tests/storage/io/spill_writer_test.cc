// SpillWriter on real files in a temporary directory: spilled bytes land in the file, old spill
// files are cleared at start, and a failed write (injected through the file system) leaves no file.
#include "storage/io/spill_writer.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fault_injecting_file_system.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::FillPattern;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

constexpr uint64_t kPage = 4096;
constexpr absl::Duration kTimeout = absl::Seconds(10);

// Page-aligned bytes of FillPattern(seed), as the arena hands out.
struct AlignedBytes {
  AlignedBytes(uint64_t size, uint64_t seed)
      : data(static_cast<uint8_t*>(std::aligned_alloc(kPage, size))), size(size) {
    FillPattern(data, size, seed);
  }
  ~AlignedBytes() { std::free(data); }
  std::string str() const { return std::string(reinterpret_cast<const char*>(data), size); }

  uint8_t* data;
  uint64_t size;
};

class SpillWriterTest : public ::testing::Test {
 protected:
  std::string directory() const { return absl::StrCat(dir_.path(), "/spill"); }

  absl::StatusOr<std::unique_ptr<SpillWriter>> Create() {
    SpillWriterOptions options;
    options.file_system = file_system_;
    return SpillWriter::Create(directory(), options);
  }

  absl::Status Spill(SpillWriter& writer, const std::string& path, const AlignedBytes& bytes) {
    absl::Notification done;
    absl::Status result;
    writer.Write(SpillJob{path, bytes.data, bytes.size, [&](absl::Status status) {
                            result = std::move(status);
                            done.Notify();
                          }});
    if (!done.WaitForNotificationWithTimeout(kTimeout)) return absl::DeadlineExceededError("");
    return result;
  }

  TempDir dir_;
  std::shared_ptr<FaultInjectingFileSystem> file_system_ =
      std::make_shared<FaultInjectingFileSystem>();
};

TEST_F(SpillWriterTest, SpilledBytesAreInTheFile) {
  auto writer = Create();
  ASSERT_THAT(writer, IsOk());
  // Several write chunks (4 MiB each) and a tail.
  const AlignedBytes bytes(9 * (1 << 20) + kPage, 7);
  const std::string path = absl::StrCat(directory(), "/a.spill");
  ASSERT_THAT(Spill(**writer, path, bytes), IsOk());
  EXPECT_EQ(testing::ReadWholeFile(path), bytes.str());
  EXPECT_GE(file_system_->calls(FileOperation::kWrite), 3u);
}

TEST_F(SpillWriterTest, RemoveDeletesASpillFileThroughTheFileSystem) {
  auto writer = Create();
  ASSERT_THAT(writer, IsOk());
  const AlignedBytes bytes(kPage, 3);
  const std::string path = absl::StrCat(directory(), "/b.spill");
  ASSERT_THAT(Spill(**writer, path, bytes), IsOk());
  (*writer)->Remove(path);
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_EQ(file_system_->calls(FileOperation::kRemove), 1u);
  (*writer)->Remove(path);  // gone already: logged at most, nothing else
  EXPECT_EQ(file_system_->calls(FileOperation::kRemove), 2u);
}

TEST_F(SpillWriterTest, EarlierSpillFilesAreRemovedAtStartAndOthersKept) {
  std::filesystem::create_directories(directory());
  ASSERT_THAT(testing::WriteFile(absl::StrCat(directory(), "/old.spill"), "x"), IsOk());
  ASSERT_THAT(testing::WriteFile(absl::StrCat(directory(), "/notes.txt"), "x"), IsOk());
  auto writer = Create();
  ASSERT_THAT(writer, IsOk());
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(directory(), "/old.spill")));
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(directory(), "/notes.txt")));
}

TEST_F(SpillWriterTest, AFullDiskFailsTheSpillAndRemovesTheFile) {
  auto writer = Create();
  ASSERT_THAT(writer, IsOk());
  const AlignedBytes bytes(3 * (4 << 20), 8);
  const std::string path = absl::StrCat(directory(), "/full.spill");
  // The second chunk finds the disk full.
  auto writes = std::make_shared<std::atomic<int>>(0);
  file_system_->SetFault(FileOperation::kWrite, [writes](const std::string&) {
    return writes->fetch_add(1) == 1 ? ENOSPC : 0;
  });
  EXPECT_THAT(Spill(**writer, path, bytes), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(std::filesystem::exists(path));
  // Room again: the next spill succeeds.
  file_system_->ClearFaults();
  ASSERT_THAT(Spill(**writer, path, bytes), IsOk());
  EXPECT_EQ(testing::ReadWholeFile(path), bytes.str());
}

TEST_F(SpillWriterTest, WhereODirectIsRefusedTheSpillIsBuffered) {
  file_system_->FailAlways(FileOperation::kOpenDirect, "", EINVAL);
  auto writer = Create();
  ASSERT_THAT(writer, IsOk());
  const AlignedBytes bytes(2 * kPage, 9);
  const std::string path = absl::StrCat(directory(), "/buffered.spill");
  ASSERT_THAT(Spill(**writer, path, bytes), IsOk());
  EXPECT_EQ(testing::ReadWholeFile(path), bytes.str());
  EXPECT_EQ(file_system_->failures(FileOperation::kOpenDirect), 1u);
}

}  // namespace
}  // namespace tierd
