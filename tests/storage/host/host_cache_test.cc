// The host tier end to end on real files: a model registered in a real catalog, read by a real
// disk reader into a real (host-device) arena. This file: fetches, and that what is read is what
// was registered (replaced, modified or linked files, checksums, verified models).
// host_cache_eviction_test.cc and host_cache_store_test.cc have the rest of this binary's tests.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "storage/model/object_checksum.h"
#include "tests/storage/host/host_cache_test_fixture.h"

namespace tierd {
namespace host_cache_test {
namespace {

TEST_F(HostCacheTest, FetchReadsTheObjectAndRecordsItsChecksum) {
  Start(4);
  RegisterModel(3);
  auto first = FetchNow("m/blocks.1");
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(HoldsBlock(*first, 1));
  EXPECT_TRUE(catalog_->Checksum("m/blocks.1").has_value());
  auto again = FetchNow("m/blocks.1");
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->data(), first->data());
  const HostCacheStats stats = cache_->stats();
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.bytes_from_disk, kObjectBytes);
}

// A fetch that asks is told each part of the object as it lands — segments of 4 MiB, in host
// memory already holding the file's bytes — all before its answer; a fetch of the resident object
// is told nothing.
TEST_F(HostCacheTest, AFetchIsToldThePartsOfTheObjectAsTheyLand) {
  Start(12);
  constexpr uint64_t kBlock = (9ull << 20) + 4096;  // three segments, the last short
  RegisterModel(1, kBlock);
  const std::string expected = testing::RandomTensor("blocks.0.w", "F32", {kBlock / 4}, 0).data;
  struct Told {
    absl::Mutex mu;
    std::map<uint64_t, uint64_t> parts ABSL_GUARDED_BY(mu);
    bool mismatched ABSL_GUARDED_BY(mu) = false;
    bool after_answer ABSL_GUARDED_BY(mu) = false;
    bool answered ABSL_GUARDED_BY(mu) = false;
  };
  auto told = std::make_shared<Told>();
  auto landed = [told, &expected](const uint8_t* bytes, uint64_t begin, uint64_t end) {
    absl::MutexLock lock(&told->mu);
    told->after_answer |= told->answered;
    told->mismatched |= std::memcmp(bytes, expected.data() + begin, end - begin) != 0 ||
                        !told->parts.emplace(begin, end).second;
  };
  absl::Notification done;
  absl::StatusOr<HostObject> object = absl::UnknownError("no answer");
  cache_->Fetch(
      "m/blocks.0", ReadPriority::kDemand, absl::InfiniteFuture(),
      [&, told](absl::StatusOr<HostObject> answer) {
        {
          absl::MutexLock lock(&told->mu);
          told->answered = true;
        }
        object = std::move(answer);
        done.Notify();
      },
      landed);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(object, IsOk());
  {
    absl::MutexLock lock(&told->mu);
    EXPECT_FALSE(told->mismatched);
    EXPECT_FALSE(told->after_answer);
    EXPECT_EQ(told->parts, (std::map<uint64_t, uint64_t>{{0, kChecksumSegmentBytes},
                                                         {kChecksumSegmentBytes, 8ull << 20},
                                                         {8ull << 20, kBlock}}));
    told->parts.clear();
  }
  ASSERT_THAT(FetchNow("m/blocks.0", landed), IsOk());
  absl::MutexLock lock(&told->mu);
  EXPECT_TRUE(told->parts.empty());  // resident: nothing landed
}

// A read that started with no fetch asking is not told of (it pays nothing for listeners): a fetch
// that joins it is told nothing, and still gets the object.
TEST_F(HostCacheTest, AFetchJoiningAReadNoOneListensToIsToldNothing) {
  Start(12);
  RegisterModel(1, (9ull << 20) + 4096);
  ASSERT_THAT(cache_->Prefetch("m/blocks.0", absl::InfiniteFuture()), IsOk());
  auto told = std::make_shared<std::atomic<int>>(0);
  absl::StatusOr<HostObject> joined =
      FetchNow("m/blocks.0", [told](const uint8_t*, uint64_t, uint64_t) { told->fetch_add(1); });
  ASSERT_THAT(joined, IsOk());
  EXPECT_EQ(joined->size(), (9ull << 20) + 4096);
  EXPECT_EQ(told->load(), 0);
}

// The threads that announce reads to the file system: the disk reader's.
class ReaderThreadsFileSystem : public FileSystemWrapper {
 public:
  ReaderThreadsFileSystem() : FileSystemWrapper(FileSystem::Default()) {}
  absl::Status BeforeRead(const std::string& path) override {
    absl::MutexLock lock(&mu_);
    readers_.insert(std::this_thread::get_id());
    return FileSystemWrapper::BeforeRead(path);
  }
  bool IsReader(std::thread::id id) {
    absl::MutexLock lock(&mu_);
    return readers_.count(id) > 0;
  }

 private:
  absl::Mutex mu_;
  std::set<std::thread::id> readers_ ABSL_GUARDED_BY(mu_);
};

// A reader thread goes on reading while the object it has just read is checksummed elsewhere: the
// answer comes from the thread that checksummed it, never from a reader thread.
TEST_F(HostCacheTest, ObjectsAreChecksummedOffTheReaderThreads) {
  auto file_system = std::make_shared<ReaderThreadsFileSystem>();
  DiskReaderOptions reader = ReaderOptions(1, 4, 64 << 10);
  reader.file_system = file_system;
  Start(4, EvictionPolicy::kFifo, reader);
  RegisterModel(3);
  std::vector<std::shared_ptr<Answer>> answers;
  std::vector<std::thread::id> answered_on(3);
  for (int i = 0; i < 3; ++i) {
    auto answer = NewAnswer();
    cache_->Fetch(absl::StrCat("m/blocks.", i), ReadPriority::kDemand, absl::InfiniteFuture(),
                  [answer, &answered_on, i](absl::StatusOr<HostObject> object) {
                    answered_on[i] = std::this_thread::get_id();
                    answer->object = std::move(object);
                    answer->ready.Notify();
                  });
    answers.push_back(answer);
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(answers[i]->ready.WaitForNotificationWithTimeout(kTimeout));
    ASSERT_THAT(answers[i]->object, IsOk());
    EXPECT_TRUE(HoldsBlock(*answers[i]->object, i));
    EXPECT_FALSE(file_system->IsReader(answered_on[i])) << "block " << i;
    EXPECT_NE(answered_on[i], std::this_thread::get_id());
  }
  EXPECT_TRUE(catalog_->Checksum("m/blocks.2").has_value());
}

// The arena pins in the background after its first piece; an object that does not fit yet waits
// for the pinning instead of failing (a prefetch right after start-up used to be refused as "host
// cache full" and never read).
TEST_F(HostCacheTest, FetchWaitsForTheArenaStillPinning) {
  Start(3, EvictionPolicy::kFifo, {}, /*pinned_pieces=*/1);
  RegisterModel(2);
  ASSERT_TRUE(arena_->pinning());
  auto answer = Fetch("m/blocks.1");
  EXPECT_FALSE(answer->ready.WaitForNotificationWithTimeout(absl::Milliseconds(200)))
      << "answered before there was room: " << answer->object.status();
  slow_device_->Open();
  ASSERT_TRUE(answer->ready.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(answer->object, IsOk());
  EXPECT_TRUE(HoldsBlock(*answer->object, 1));
}

// Nor does it evict what is cached to make room that pinning is about to add.
TEST_F(HostCacheTest, FetchWaitsForPinningRatherThanEvict) {
  Start(4, EvictionPolicy::kFifo, {}, /*pinned_pieces=*/3);  // room for two objects so far
  RegisterModel(3);
  ASSERT_THAT(FetchNow("m/blocks.0"), IsOk());
  ASSERT_THAT(FetchNow("m/blocks.1"), IsOk());
  auto third = Fetch("m/blocks.2");
  EXPECT_FALSE(third->ready.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  slow_device_->Open();
  ASSERT_TRUE(third->ready.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(third->object, IsOk());
  EXPECT_TRUE(HoldsBlock(*third->object, 2));
  EXPECT_EQ(cache_->stats().evictions, 0u);
  EXPECT_EQ(cache_->stats().objects, 3u);
}

TEST_F(HostCacheTest, ConcurrentFetchesOfOneObjectShareOneRead) {
  Start(4);
  RegisterModel(2);
  std::vector<std::shared_ptr<Answer>> answers;
  for (int i = 0; i < 10; ++i) answers.push_back(Fetch("m/blocks.0"));
  for (auto& answer : answers) {
    ASSERT_TRUE(answer->ready.WaitForNotificationWithTimeout(kTimeout));
    ASSERT_THAT(answer->object, IsOk());
    EXPECT_EQ(answer->object->data(), answers[0]->object->data());
  }
  EXPECT_TRUE(HoldsBlock(*answers[0]->object, 0));
  EXPECT_EQ(cache_->stats().bytes_from_disk, kObjectBytes);
}

TEST_F(HostCacheTest, UnknownKeysAreErrors) {
  Start(2);
  RegisterModel(1);
  EXPECT_THAT(FetchNow("m/blocks.9"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(FetchNow("nope/x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(FetchNow("no-slash"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cache_->Prefetch("m/blocks.9", absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(HostCacheTest, FlippedByteOnDiskIsDataLossAndNeverHandedOut) {
  Start(2);
  RegisterModel(2);
  ExpectAFlippedByteIsDataLoss();
}

// A model on tmpfs is read by the reader threads from memory, in pieces hashed as they land: its
// objects come back exact, and a byte flipped in the file is found the same way.
TEST_F(HostCacheTest, AModelOnTmpfsIsHashedAsItsPiecesLandAndAFlippedByteIsDataLoss) {
  const TempDir shm("/dev/shm");
  Start(2);
  RegisterModel(2, kObjectBytes, /*verify=*/false, shm.path());
  ExpectAFlippedByteIsDataLoss();
}

// --- What is read is what was registered ---------------------------------------------------

TEST_F(HostCacheTest, AFileReplacedByALinkOutOfTheRootsIsRefusedAtItsFirstRead) {
  const std::string root = absl::StrCat(dir_.path(), "/models");
  std::filesystem::create_directories(root);
  auto roots = ModelRoots::Create({root});
  ASSERT_THAT(roots, IsOk());
  Start(2, EvictionPolicy::kFifo, {}, 0, *roots);
  RegisterModel(2);
  // Before any read, the registered file becomes a link to a file outside every root, with the
  // same layout: following it would serve that file's bytes and record their checksum.
  const std::string outside = absl::StrCat(dir_.path(), "/outside.safetensors");
  ASSERT_EQ(::rename(ModelFilePath().c_str(), outside.c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), ModelFilePath().c_str()), 0);
  const absl::StatusOr<HostObject> fetched = FetchNow("m/blocks.0");
  EXPECT_THAT(fetched, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(fetched.status().message()), ::testing::HasSubstr("symbolic link"));
  EXPECT_FALSE(catalog_->Checksum("m/blocks.0").has_value());
  // The model is stale from now on, and the listing says why.
  EXPECT_THAT(FetchNow("m/blocks.1"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(catalog_->ListModels().at(0).stale, ::testing::HasSubstr("symbolic link"));
}

TEST_F(HostCacheTest, AFileReplacedBeforeItsFirstReadIsRefusedThoughItsSizeAndMtimeMatch) {
  Start(2);
  RegisterModel(2);
  // Another file with the same size and mtime renamed over the registered one.
  const std::string other = absl::StrCat(dir_.path(), "/other.safetensors");
  ASSERT_EQ(::link(ModelFilePath().c_str(), absl::StrCat(other, ".orig").c_str()), 0);
  ASSERT_TRUE(std::filesystem::copy_file(ModelFilePath(), other));
  {
    const ScopedMtime keep(other);
    std::fstream file(other, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-1, std::ios::end);
    file.put('\x7f');
  }
  struct stat registered {};
  ASSERT_EQ(::stat(ModelFilePath().c_str(), &registered), 0);
  const timespec times[2] = {{0, UTIME_OMIT}, registered.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, other.c_str(), times, 0), 0);
  ASSERT_EQ(::rename(other.c_str(), ModelFilePath().c_str()), 0);
  const absl::StatusOr<HostObject> fetched = FetchNow("m/blocks.1");
  EXPECT_THAT(fetched, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(fetched.status().message()), ::testing::HasSubstr("was replaced"));
  EXPECT_FALSE(catalog_->Checksum("m/blocks.1").has_value());
}

TEST_F(HostCacheTest, AFileModifiedAfterItWasOpenedIsRefusedBeforeTheNextRead) {
  Start(2);
  RegisterModel(2);
  ASSERT_THAT(FetchNow("m/blocks.0"), IsOk());  // the reader now holds the file open
  {
    std::fstream file(ModelFilePath(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-1, std::ios::end);
    file.put('\x7f');
  }
  // The file's mtime moved: block 1, never read, is not read from the modified file.
  EXPECT_THAT(FetchNow("m/blocks.1"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(catalog_->Checksum("m/blocks.1").has_value());
}

TEST_F(HostCacheTest, AModelRegisteredAgainAfterItsFileWasReplacedIsReadFromTheNewFile) {
  Start(2);
  RegisterModel(2);
  ASSERT_THAT(FetchNow("m/blocks.0"), IsOk());  // the reader now holds the file open
  // The file is updated as rsync or mv do: a new file renamed over the old one.
  const std::string update = absl::StrCat(dir_.path(), "/update.safetensors");
  ASSERT_THAT(testing::WriteSafetensors(
                  update, {testing::RandomTensor("blocks.0.w", "F32", {kObjectBytes / 4}, 10),
                           testing::RandomTensor("blocks.1.w", "F32", {kObjectBytes / 4}, 11)}),
              IsOk());
  ASSERT_EQ(::rename(update.c_str(), ModelFilePath().c_str()), 0);
  // The descriptor the reader holds is still the registered file: its bytes are what is served.
  auto registered = FetchNow("m/blocks.1");
  ASSERT_THAT(registered, IsOk());
  EXPECT_TRUE(HoldsBlock(*registered, 1));
  registered = absl::CancelledError("released");
  // The model is dropped and registered again: the new file is read, not the old descriptor's.
  ASSERT_THAT(catalog_->DropModel("m"), IsOk());
  ASSERT_THAT(catalog_->RegisterModel("m", model_dir_, Grouping::kBlock, GroupingRules::Defaults()),
              IsOk());
  auto fetched = FetchNow("m/blocks.1");
  ASSERT_THAT(fetched, IsOk());
  EXPECT_EQ(FirstPatternMismatch(fetched->data(), kObjectBytes, 11), -1);
}

TEST_F(HostCacheTest, AFifoWhereAModelFileWasIsRefusedWithoutBlockingTheReader) {
  Start(2);
  RegisterModel(2);
  ASSERT_EQ(::unlink(ModelFilePath().c_str()), 0);
  ASSERT_EQ(::mkfifo(ModelFilePath().c_str(), 0600), 0);
  auto answer = Fetch("m/blocks.0");
  const bool answered = answer->ready.WaitForNotificationWithTimeout(absl::Seconds(5));
  if (!answered) {
    // Unblock the reader's open so the test can end, then fail.
    const int writer = ::open(ModelFilePath().c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
    ASSERT_TRUE(answer->ready.WaitForNotificationWithTimeout(kTimeout));
  }
  EXPECT_TRUE(answered) << "opening the FIFO blocked the reader";
  EXPECT_THAT(answer->object, StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(HostCacheTest, AVerifiedGatheredObjectWithATrailingGapIsReadAsVerified) {
  // Block 0's second tensor is empty and in another file: the object is its first tensor (1000
  // bytes, one extent at offset 0) and a gap up to 1024. The gap must read as it was verified.
  Start(2);
  model_dir_ = absl::StrCat(dir_.path(), "/models/trailing");
  std::filesystem::create_directories(model_dir_);
  ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/a.safetensors"),
                                        {testing::RandomTensor("blocks.0.w", "F32", {250}, 1),
                                         testing::RandomTensor("blocks.1.w", "F32", {250}, 2)}),
              IsOk());
  ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/b.safetensors"),
                                        {testing::RandomTensor("blocks.0.empty", "F32", {0}, 3)}),
              IsOk());
  ASSERT_THAT(catalog_->RegisterModel("t", model_dir_, Grouping::kBlock, GroupingRules::Defaults(),
                                      nullptr, /*verify=*/true),
              IsOk());
  auto object = FetchNow("t/blocks.0");
  ASSERT_THAT(object, IsOk());
  EXPECT_EQ(object->size(), 1024u);
  EXPECT_EQ(cache_->stats().checksum_failures, 0u);
  // Hashed as it landed, the gap counted as the registration's verification counted it.
  EXPECT_EQ(cache_->stats().checksums_while_reading, 1u);
}

TEST_F(HostCacheTest, AVerifiedModelChecksBytesChangedBeforeTheirFirstRead) {
  // A write that keeps the file's size, inode and mtime is invisible to every check but the
  // checksum: with --verify even the first read has one to compare with.
  Start(2);
  RegisterModel(2, kObjectBytes, /*verify=*/true);
  {
    const ScopedMtime keep(ModelFilePath());
    std::fstream file(ModelFilePath(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-1, std::ios::end);
    file.put('\x7f');
  }
  EXPECT_THAT(FetchNow("m/blocks.1"), StatusIs(absl::StatusCode::kDataLoss));
  auto intact = FetchNow("m/blocks.0");
  ASSERT_THAT(intact, IsOk());
  EXPECT_TRUE(HoldsBlock(*intact, 0));
}

TEST_F(HostCacheTest, AGatheredObjectReadAgainInReusedMemoryHasTheSameChecksum) {
  // Each block's two tensors lie apart in the file (all "a"s, then all "b"s), so blocks are
  // gathered, with gaps between their tensors (1000 bytes each, aligned to 256).
  Start(1);
  model_dir_ = absl::StrCat(dir_.path(), "/models/gathered");
  std::filesystem::create_directories(model_dir_);
  constexpr int kBlocks = 6;
  constexpr uint64_t kTensorElements = kObjectBytes / 8 / 4 - 6;  // an eighth of the arena, odd
  std::vector<testing::TensorSpec> tensors;
  for (const char* part : {"a", "b"}) {
    for (int i = 0; i < kBlocks; ++i) {
      tensors.push_back(testing::RandomTensor(absl::StrCat("blocks.", i, ".", part), "F32",
                                              {kTensorElements}, i * 2 + (part[0] - 'a')));
    }
  }
  ASSERT_THAT(testing::WriteSafetensors(ModelFilePath(), tensors), IsOk());
  ASSERT_THAT(catalog_->RegisterModel("g", model_dir_, Grouping::kBlock, GroupingRules::Defaults()),
              IsOk());
  // Every block is read once (its checksum recorded); then the memory is filled with other bytes
  // (stored objects, deleted again), and every block is read a second time.
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kBlocks; ++i) {
      EXPECT_THAT(FetchNow(absl::StrCat("g/blocks.", i)), IsOk()) << "round " << round;
    }
    if (round == 1) break;
    for (int i = 0; i < kBlocks; ++i) {
      const absl::Status evicted = cache_->Evict(absl::StrCat("g/blocks.", i));
      ASSERT_TRUE(evicted.ok() || absl::IsNotFound(evicted)) << evicted;  // FIFO took the first
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_THAT(Store(absl::StrCat("kv/fill", i), kObjectBytes / 4, 100 + i, false), IsOk());
    }
    for (int i = 0; i < 4; ++i) ASSERT_THAT(cache_->Delete(absl::StrCat("kv/fill", i)), IsOk());
  }
  EXPECT_EQ(cache_->stats().checksum_failures, 0u);
  // Every read, the gaps between the tensors included, was hashed as its bytes landed.
  EXPECT_EQ(cache_->stats().checksums_while_reading, 2u * kBlocks);
}

}  // namespace
}  // namespace host_cache_test
}  // namespace tierd
