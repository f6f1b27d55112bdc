// DurableStore on real files in a temporary directory: versions persisted and recovered, damaged
// and unfinished files set aside, removals, and failures injected through the file system.
#include "storage/host/durable_store.h"

#include <xxhash.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/model/object_checksum.h"
#include "testing/fault_injecting_file_system.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(10);

class DurableStoreTest : public ::testing::Test {
 protected:
  std::string directory() const { return absl::StrCat(dir_.path(), "/durable"); }

  absl::StatusOr<std::unique_ptr<DurableStore>> Open(std::vector<DurableRecord>* recovered) {
    DurableStoreOptions options;
    options.file_system = file_system_;
    return DurableStore::Open(directory(), options, recovered);
  }

  // Persists `bytes` as `key` with one U8 tensor over all of it and waits for the answer.
  absl::StatusOr<DurableRecord> Persist(DurableStore& store, const std::string& key,
                                        const std::string& bytes) {
    TensorPlacement tensor;
    tensor.name = "t";
    tensor.shape = {bytes.size()};
    tensor.size = bytes.size();
    absl::Notification done;
    absl::StatusOr<DurableRecord> result = absl::UnknownError("no answer");
    store.Persist(key, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), {tensor},
                  [&](absl::StatusOr<DurableRecord> record) {
                    result = std::move(record);
                    done.Notify();
                  });
    if (!done.WaitForNotificationWithTimeout(kTimeout)) return absl::DeadlineExceededError("");
    return result;
  }

  std::vector<std::string> FileNames() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(directory())) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  TempDir dir_;
  std::shared_ptr<FaultInjectingFileSystem> file_system_ =
      std::make_shared<FaultInjectingFileSystem>();
};

TEST_F(DurableStoreTest, APersistedObjectIsRecoveredWithItsBytesAndTensors) {
  const std::string bytes(10000, 'q');
  {
    std::vector<DurableRecord> recovered;
    auto store = Open(&recovered);
    ASSERT_THAT(store, IsOk());
    EXPECT_TRUE(recovered.empty());
    auto record = Persist(**store, "kv/a", bytes);
    ASSERT_THAT(record, IsOk());
    EXPECT_EQ(record->payload_offset % 4096, 0u);
    EXPECT_EQ((*store)->stats().objects, 1u);
    EXPECT_EQ((*store)->stats().bytes, bytes.size());
  }
  std::vector<DurableRecord> recovered;
  auto store = Open(&recovered);
  ASSERT_THAT(store, IsOk());
  ASSERT_EQ(recovered.size(), 1u);
  const DurableRecord& record = recovered[0];
  EXPECT_EQ(record.key, "kv/a");
  EXPECT_EQ(record.size, bytes.size());
  ASSERT_EQ(record.tensors.size(), 1u);
  EXPECT_EQ(record.tensors[0].name, "t");
  const std::string file = testing::ReadWholeFile(record.path);
  EXPECT_EQ(file.substr(record.payload_offset), bytes);
}

// A record holds the object's checksum of segments, and says so; one written before checksums were
// made of segments (no "checksum_segment_bytes" in its metadata) is recovered as holding the whole
// object's xxHash3, which the host cache then checks it against.
TEST_F(DurableStoreTest, RecordsSayWhetherTheirChecksumIsOfSegmentsOrOfTheWholeObject) {
  std::string bytes(kChecksumSegmentBytes + 1000, '\0');
  ::tierd::testing::FillPattern(bytes.data(), bytes.size(), 4);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  std::string path;
  {
    std::vector<DurableRecord> recovered;
    auto store = Open(&recovered);
    ASSERT_THAT(store, IsOk());
    auto record = Persist(**store, "kv/a", bytes);
    ASSERT_THAT(record, IsOk());
    EXPECT_EQ(record->checksum, ObjectChecksum(data, bytes.size()));
    EXPECT_FALSE(record->whole_object_checksum);
    path = record->path;
  }
  // Rewrite the header as an older daemon wrote it: the same fields but the segments' size, and
  // the whole object's checksum. The metadata shrinks, the payload stays on its page.
  std::string file = testing::ReadWholeFile(path);
  const uint32_t metadata_bytes = static_cast<uint8_t>(file[8]) |
                                  static_cast<uint8_t>(file[9]) << 8 |
                                  static_cast<uint8_t>(file[10]) << 16 |
                                  static_cast<uint32_t>(static_cast<uint8_t>(file[11])) << 24;
  nlohmann::json metadata = nlohmann::json::parse(file.substr(24, metadata_bytes));
  ASSERT_TRUE(metadata.contains("checksum_segment_bytes"));
  metadata.erase("checksum_segment_bytes");
  metadata["checksum"] = absl::StrFormat("%016x", WholeObjectChecksum(data, bytes.size()));
  const std::string older = metadata.dump();
  ASSERT_LE(older.size(), metadata_bytes);
  const uint64_t older_checksum = XXH3_64bits(older.data(), older.size());
  for (int i = 0; i < 4; ++i) file[8 + i] = static_cast<char>(older.size() >> (8 * i));
  for (int i = 0; i < 8; ++i) file[16 + i] = static_cast<char>(older_checksum >> (8 * i));
  file.replace(24, older.size(), older);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << file;
  }
  std::vector<DurableRecord> recovered;
  auto store = Open(&recovered);
  ASSERT_THAT(store, IsOk());
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_TRUE(recovered[0].whole_object_checksum);
  EXPECT_EQ(recovered[0].checksum, WholeObjectChecksum(data, bytes.size()));
  EXPECT_EQ(testing::ReadWholeFile(recovered[0].path).substr(recovered[0].payload_offset), bytes);
}

TEST_F(DurableStoreTest, ANewVersionReplacesTheOldOneAndRemovingItIsFinal) {
  std::vector<DurableRecord> recovered;
  auto store = Open(&recovered);
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT(Persist(**store, "k", "first version"), IsOk());
  auto second = Persist(**store, "k", "second");
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(FileNames().size(), 1u);  // the first version is gone
  EXPECT_EQ((*store)->stats().bytes, 6u);
  ASSERT_THAT((*store)->RemoveAndWait("k"), IsOk());
  EXPECT_TRUE(FileNames().empty());
  store->reset();
  ASSERT_THAT(Open(&recovered), IsOk());
  EXPECT_TRUE(recovered.empty());
}

TEST_F(DurableStoreTest, DamagedAndUnfinishedFilesAreSetAsideOnOpen) {
  {
    std::vector<DurableRecord> recovered;
    auto store = Open(&recovered);
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT(Persist(**store, "good", "bytes"), IsOk());
  }
  ASSERT_THAT(testing::WriteFile(absl::StrCat(directory(), "/0-1.tdo"), "TIERDDO1 garbage"),
              IsOk());
  ASSERT_THAT(testing::WriteFile(absl::StrCat(directory(), "/0-2.tmp"), "half"), IsOk());
  std::vector<DurableRecord> recovered;
  ASSERT_THAT(Open(&recovered), IsOk());
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0].key, "good");
  const std::vector<std::string> names = FileNames();
  EXPECT_THAT(names, ::testing::Contains("0-1.tdo.damaged"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("0-2.tmp")));
}

TEST_F(DurableStoreTest, AFullDiskRefusesThePersistAndKeepsThePreviousVersion) {
  std::vector<DurableRecord> recovered;
  auto store = Open(&recovered);
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT(Persist(**store, "k", "first"), IsOk());
  file_system_->FailAlways(FileOperation::kWrite, directory(), ENOSPC);
  const auto refused = Persist(**store, "k", "second");
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("durable object k"));
  EXPECT_EQ((*store)->stats().persist_failures, 1u);
  ASSERT_EQ(FileNames().size(), 1u);
  EXPECT_TRUE(absl::EndsWith(FileNames()[0], ".tdo"));
  store->reset();
  file_system_->ClearFaults();
  ASSERT_THAT(Open(&recovered), IsOk());
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0].size, 5u);  // "first"
}

TEST_F(DurableStoreTest, AFailedDirectorySyncFailsTheRemoval) {
  std::vector<DurableRecord> recovered;
  auto store = Open(&recovered);
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT(Persist(**store, "k", "bytes"), IsOk());
  file_system_->FailAlways(FileOperation::kSyncDirectory, "", EIO);
  EXPECT_FALSE((*store)->RemoveAndWait("k").ok());
  EXPECT_GE(file_system_->failures(FileOperation::kSyncDirectory), 1u);
}

}  // namespace
}  // namespace tierd
