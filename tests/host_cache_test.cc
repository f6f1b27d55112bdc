// The host tier end to end on real files: a model registered in a real catalog, read by a real
// disk reader into a real (host-device) arena.
#include "storage/host_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/fault_injecting_file_system.h"
#include "storage/storage_stack.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::FillPattern;
using ::tierd::testing::FirstPatternMismatch;
using ::tierd::testing::IsOk;
using ::tierd::testing::ReaderOptions;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

constexpr uint64_t kObjectBytes = kMiB;  // one F32 tensor per block
constexpr absl::Duration kTimeout = absl::Seconds(60);

// The answer to one Fetch or ReserveStore.
struct Answer {
  absl::Notification ready;
  absl::StatusOr<HostObject> object = absl::UnknownError("no answer");
};

// A device whose host-memory registrations after the first `prompt` wait for `gate`: an arena on
// it keeps pinning in the background until the test opens the gate.
class SlowPinningDevice : public DeviceWrapper {
 public:
  SlowPinningDevice(Device& target, int prompt) : DeviceWrapper(target), prompt_(prompt) {}
  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    if (registrations_++ >= prompt_) gate.WaitForNotification();
    return DeviceWrapper::RegisterHostMemory(data, bytes);
  }
  void Open() {
    if (!gate.HasBeenNotified()) gate.Notify();
  }

  absl::Notification gate;

 private:
  const int prompt_;
  std::atomic<int> registrations_{0};
};

// Puts a file's mtime back when it goes out of scope: a write under it changes the bytes but not
// what the file's metadata says, as a failing disk or a careful attacker would.
class ScopedMtime {
 public:
  explicit ScopedMtime(std::string path) : path_(std::move(path)) {
    struct stat st {};
    EXPECT_EQ(::stat(path_.c_str(), &st), 0);
    mtime_ = st.st_mtim;
  }
  ~ScopedMtime() {
    const timespec times[2] = {{0, UTIME_OMIT}, mtime_};
    EXPECT_EQ(::utimensat(AT_FDCWD, path_.c_str(), times, 0), 0);
  }
  ScopedMtime(const ScopedMtime&) = delete;
  ScopedMtime& operator=(const ScopedMtime&) = delete;

 private:
  std::string path_;
  timespec mtime_{};
};

class HostCacheTest : public ::testing::Test {
 protected:
  // A cache holding `capacity_objects` block objects (each may take a page more than its size:
  // room to read it in place). With `pinned_pieces` > 0, only that many of the arena's pieces
  // (kObjectBytes each) are pinned until slow_device_->Open(). Every tier's files go through
  // reader_options.file_system.
  void Start(int capacity_objects, EvictionPolicy policy = EvictionPolicy::kFifo,
             DiskReaderOptions reader_options = {}, int pinned_pieces = 0,
             ModelRoots roots = ModelRoots()) {
    const bool slow_pinning = pinned_pieces > 0;
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    Device* arena_device = device_.get();
    if (slow_pinning) {
      slow_device_ = std::make_unique<SlowPinningDevice>(*device_, pinned_pieces);
      arena_device = slow_device_.get();
    }
    StorageStackOptions options;
    options.state_dir = absl::StrCat(dir_.path(), "/state");
    options.spill_dir = absl::StrCat(dir_.path(), "/spill");
    options.durable_store = false;
    options.model_roots = std::move(roots);
    options.arena = {capacity_objects * (kObjectBytes + 4096), kObjectBytes};
    options.file_system = reader_options.file_system;
    options.reader = std::move(reader_options);
    options.host_cache = HostCacheOptions{policy};
    auto storage = StorageStack::Create(*arena_device, options);
    ASSERT_THAT(storage, IsOk());
    storage_ = *std::move(storage);
    arena_ = &storage_->arena();
    catalog_ = &storage_->catalog();
    spill_ = &storage_->spill();
    cache_ = &storage_->host_cache();
    if (!slow_pinning) {
      ASSERT_TRUE(arena_->WaitUntilFullyPinned(kTimeout));
    }
  }

  void TearDown() override {
    if (slow_device_ != nullptr) slow_device_->Open();
    // A callback's closure, which shares its Answer, may be destroyed on the cache's thread after
    // the test has read the answer: drop the references answers hold before the cache goes.
    for (const std::weak_ptr<Answer>& weak : answers_) {
      std::shared_ptr<Answer> answer = weak.lock();
      if (answer != nullptr && answer->ready.HasBeenNotified()) {
        answer->object = absl::CancelledError("test over");
      }
    }
    storage_.reset();
  }

  // Writes model "m" with `blocks` blocks of one F32 tensor each (seed = block index) and
  // registers it grouped per block: keys "m/blocks.N".
  void RegisterModel(int blocks, uint64_t block_bytes = kObjectBytes, bool verify = false) {
    model_dir_ = absl::StrCat(dir_.path(), "/models/model");
    std::filesystem::create_directories(model_dir_);
    std::vector<testing::TensorSpec> tensors;
    for (int i = 0; i < blocks; ++i) {
      tensors.push_back(
          testing::RandomTensor(absl::StrCat("blocks.", i, ".w"), "F32", {block_bytes / 4}, i));
    }
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/model.safetensors"), tensors),
                IsOk());
    ASSERT_THAT(catalog_->RegisterModel("m", model_dir_, Grouping::kBlock,
                                        GroupingRules::Defaults(), nullptr, verify),
                IsOk());
  }

  std::string ModelFilePath() const { return absl::StrCat(model_dir_, "/model.safetensors"); }

  std::shared_ptr<Answer> NewAnswer() {
    auto answer = std::make_shared<Answer>();
    answers_.push_back(answer);
    return answer;
  }

  std::shared_ptr<Answer> Fetch(const std::string& key,
                                ReadPriority priority = ReadPriority::kDemand) {
    auto answer = NewAnswer();
    cache_->Fetch(key, priority, absl::InfiniteFuture(), [answer](absl::StatusOr<HostObject> o) {
      answer->object = std::move(o);
      answer->ready.Notify();
    });
    return answer;
  }

  absl::StatusOr<HostObject> FetchNow(const std::string& key) {
    auto answer = Fetch(key);
    if (!answer->ready.WaitForNotificationWithTimeout(kTimeout)) {
      return absl::DeadlineExceededError("fetch did not answer");
    }
    return std::move(answer->object);
  }

  std::shared_ptr<Answer> Reserve(const std::string& key, uint64_t bytes, bool spillable) {
    auto answer = NewAnswer();
    cache_->ReserveStore(key, bytes, spillable, [answer](absl::StatusOr<HostObject> o) {
      answer->object = std::move(o);
      answer->ready.Notify();
    });
    return answer;
  }

  // Stores `bytes` of pattern `seed` under `key`.
  absl::Status Store(const std::string& key, uint64_t bytes, uint64_t seed, bool spillable) {
    auto answer = Reserve(key, bytes, spillable);
    if (!answer->ready.WaitForNotificationWithTimeout(kTimeout)) {
      return absl::DeadlineExceededError("reserve did not answer");
    }
    if (!answer->object.ok()) return answer->object.status();
    FillPattern(answer->object->data(), bytes, seed);
    return cache_->CommitStore(*answer->object);
  }

  // The tensor of block `i` as written to the file.
  static bool HoldsBlock(const HostObject& object, int i) {
    return object.size() == kObjectBytes &&
           FirstPatternMismatch(object.data(), kObjectBytes, i) == -1;
  }

  TempDir dir_;
  std::string model_dir_;
  std::unique_ptr<HostDevice> device_;
  std::unique_ptr<SlowPinningDevice> slow_device_;
  std::unique_ptr<StorageStack> storage_;
  // The stack's tiers.
  HostArena* arena_ = nullptr;
  Catalog* catalog_ = nullptr;
  SpillWriter* spill_ = nullptr;
  HostCache* cache_ = nullptr;
  std::vector<std::weak_ptr<Answer>> answers_;  // every answer given out, for TearDown
};

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
  ASSERT_THAT(FetchNow("m/blocks.1"), IsOk());  // records the checksum
  ASSERT_THAT(cache_->Evict("m/blocks.1"), IsOk());
  {
    // Block 1's tensor starts after block 0's: flip a byte in its middle, keeping the size and,
    // as a failing disk does, the mtime.
    const std::string path = absl::StrCat(model_dir_, "/model.safetensors");
    const ScopedMtime keep(path);
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(0, std::ios::end);
    const std::streamoff position = static_cast<std::streamoff>(file.tellg()) - kObjectBytes / 2;
    file.seekg(position);
    const char byte = static_cast<char>(file.get());
    file.seekp(position);
    file.put(static_cast<char>(byte ^ 0x40));
  }
  EXPECT_THAT(FetchNow("m/blocks.1"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_FALSE(cache_->IsResident("m/blocks.1"));
  EXPECT_EQ(cache_->stats().checksum_failures, 1u);
  // The other object is unharmed.
  auto other = FetchNow("m/blocks.0");
  ASSERT_THAT(other, IsOk());
  EXPECT_TRUE(HoldsBlock(*other, 0));
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
}

TEST_F(HostCacheTest, FifoEvictsInOrderOfArrival) {
  Start(3, EvictionPolicy::kFifo);
  RegisterModel(4);
  for (int i : {0, 1, 2}) ASSERT_THAT(FetchNow(absl::StrCat("m/blocks.", i)), IsOk());
  ASSERT_THAT(FetchNow("m/blocks.0"), IsOk());  // a hit does not change FIFO order
  ASSERT_THAT(FetchNow("m/blocks.3"), IsOk());
  EXPECT_FALSE(cache_->IsResident("m/blocks.0"));
  EXPECT_TRUE(cache_->IsResident("m/blocks.1"));
  EXPECT_TRUE(cache_->IsResident("m/blocks.2"));
  EXPECT_EQ(cache_->stats().evictions, 1u);
}

TEST_F(HostCacheTest, LruEvictsTheLeastRecentlyUsed) {
  Start(3, EvictionPolicy::kLru);
  RegisterModel(4);
  for (int i : {0, 1, 2}) ASSERT_THAT(FetchNow(absl::StrCat("m/blocks.", i)), IsOk());
  ASSERT_THAT(FetchNow("m/blocks.0"), IsOk());
  ASSERT_THAT(FetchNow("m/blocks.3"), IsOk());
  EXPECT_TRUE(cache_->IsResident("m/blocks.0"));
  EXPECT_FALSE(cache_->IsResident("m/blocks.1"));
}

TEST_F(HostCacheTest, ReferencedAndPinnedObjectsAreNeverEvicted) {
  Start(2);
  RegisterModel(3);
  auto held = FetchNow("m/blocks.0");
  ASSERT_THAT(held, IsOk());
  ASSERT_THAT(FetchNow("m/blocks.1"), IsOk());
  ASSERT_THAT(cache_->Pin("m/blocks.1"), IsOk());
  // Full of a referenced and a pinned object: no room, at once.
  EXPECT_THAT(FetchNow("m/blocks.2"), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(cache_->Evict("m/blocks.0"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(HoldsBlock(*held, 0));
  held->Reset();
  auto third = FetchNow("m/blocks.2");
  ASSERT_THAT(third, IsOk());
  EXPECT_TRUE(HoldsBlock(*third, 2));
  EXPECT_FALSE(cache_->IsResident("m/blocks.0"));
  EXPECT_TRUE(cache_->IsResident("m/blocks.1"));
  EXPECT_THAT(cache_->Unpin("m/blocks.1"), IsOk());
  EXPECT_THAT(cache_->Unpin("m/blocks.1"), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(HostCacheTest, ObjectBeingReadIsNeverEvicted) {
  // Room for one 32 MiB object (and change); one reader thread in small chunks keeps it loading.
  Start(33, EvictionPolicy::kFifo, ReaderOptions(1, 1, 64 * 1024));
  RegisterModel(2, 32 * kMiB);
  // A prefetch holds no reference: only its being in flight protects it.
  ASSERT_THAT(cache_->Prefetch("m/blocks.0", absl::InfiniteFuture()), IsOk());
  EXPECT_THAT(FetchNow("m/blocks.1"), StatusIs(absl::StatusCode::kResourceExhausted));
  const absl::Time deadline = absl::Now() + kTimeout;
  while (!cache_->IsResident("m/blocks.0") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto loaded = FetchNow("m/blocks.0");
  ASSERT_THAT(loaded, IsOk());
  EXPECT_EQ(FirstPatternMismatch(loaded->data(), 32 * kMiB, 0), -1);
  // Once loaded and unreferenced it is an ordinary candidate again.
  loaded->Reset();
  auto second = FetchNow("m/blocks.1");
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(FirstPatternMismatch(second->data(), 32 * kMiB, 1), -1);
  EXPECT_FALSE(cache_->IsResident("m/blocks.0"));
}

TEST_F(HostCacheTest, StoredObjectIsVisibleOnlyAfterCommit) {
  Start(4);
  auto reservation = Reserve("act/s_kv_0_3", 3 * kMiB + 7, /*spillable=*/false);
  ASSERT_TRUE(reservation->ready.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(reservation->object, IsOk());
  FillPattern(reservation->object->data(), 3 * kMiB + 7, 99);
  EXPECT_THAT(FetchNow("act/s_kv_0_3"), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(cache_->CommitStore(*reservation->object), IsOk());
  EXPECT_THAT(cache_->CommitStore(*reservation->object),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  auto fetched = FetchNow("act/s_kv_0_3");
  ASSERT_THAT(fetched, IsOk());
  EXPECT_EQ(FirstPatternMismatch(fetched->data(), 3 * kMiB + 7, 99), -1);
}

TEST_F(HostCacheTest, ReplacingAStoredObjectLeavesHoldersOfTheOldOneAlone) {
  Start(4);
  ASSERT_THAT(Store("act/x", kMiB, 1, false), IsOk());
  auto old = FetchNow("act/x");
  ASSERT_THAT(old, IsOk());
  ASSERT_THAT(Store("act/x", kMiB, 2, false), IsOk());
  auto fresh = FetchNow("act/x");
  ASSERT_THAT(fresh, IsOk());
  EXPECT_EQ(FirstPatternMismatch(old->data(), kMiB, 1), -1);
  EXPECT_EQ(FirstPatternMismatch(fresh->data(), kMiB, 2), -1);
  old->Reset();
  EXPECT_EQ(cache_->stats().used_bytes, kMiB);
}

TEST_F(HostCacheTest, StoredObjectsSpillUnderPressureAndComeBackEqual) {
  Start(2);
  for (int i = 0; i < 5; ++i) {
    ASSERT_THAT(Store(absl::StrCat("act/", i), kObjectBytes, 100 + i, /*spillable=*/true), IsOk())
        << i;
  }
  HostCacheStats stats = cache_->stats();
  EXPECT_GE(stats.spills, 3u);
  EXPECT_EQ(stats.stored_objects, 5u);
  for (int i = 0; i < 5; ++i) {
    auto object = FetchNow(absl::StrCat("act/", i));
    ASSERT_THAT(object, IsOk()) << i;
    EXPECT_EQ(FirstPatternMismatch(object->data(), kObjectBytes, 100 + i), -1) << i;
  }
  EXPECT_GE(cache_->stats().bytes_from_disk, 3 * kObjectBytes);
}

TEST_F(HostCacheTest, CacheFullOfUnspillableObjectsSaysResourceExhausted) {
  Start(2);
  ASSERT_THAT(Store("act/a", kObjectBytes, 1, false), IsOk());
  ASSERT_THAT(Store("act/b", kObjectBytes, 2, false), IsOk());
  EXPECT_THAT(Store("act/c", kObjectBytes, 3, true),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(cache_->Evict("act/a"), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(cache_->Delete("act/a"), IsOk());
  EXPECT_THAT(Store("act/c", kObjectBytes, 3, true), IsOk());
  EXPECT_THAT(FetchNow("act/a"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(HostCacheTest, CorruptSpillFileIsDataLoss) {
  Start(2);
  ASSERT_THAT(Store("act/a", kObjectBytes, 1, true), IsOk());
  ASSERT_THAT(cache_->Evict("act/a"), IsOk());  // spills
  const absl::Time deadline = absl::Now() + kTimeout;
  while (cache_->IsResident("act/a") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(cache_->stats().spilled_objects, 1u);
  std::string spill_file;
  for (const auto& file : std::filesystem::directory_iterator(spill_->directory())) {
    spill_file = file.path().string();
  }
  ASSERT_FALSE(spill_file.empty());
  {
    std::fstream file(spill_file, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(12345);
    file.put('\x5a');
  }
  EXPECT_THAT(FetchNow("act/a"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(FetchNow("act/a"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(std::filesystem::exists(spill_file));
}

// Opening spill files fails (PERMISSION_DENIED, which keeps a stored object) until `gate` opens;
// with `then_missing`, every second attempt fails as NOT_FOUND instead (the object is lost).
struct SpillOpenFaults {
  std::shared_ptr<absl::Notification> gate = std::make_shared<absl::Notification>();
  std::shared_ptr<std::atomic<int>> attempts = std::make_shared<std::atomic<int>>(0);
  bool then_missing = false;

  DiskReaderOptions Options() const {
    auto file_system = std::make_shared<FaultInjectingFileSystem>();
    file_system->SetFault(
        FileOperation::kOpenForRead,
        [gate = gate, attempts = attempts, then_missing = then_missing](const std::string& path) {
          if (!absl::EndsWith(path, ".spill")) return 0;
          gate->WaitForNotification();
          const int attempt = (*attempts)++;
          // One open per attempt to read: the buffered open comes first and fails.
          return then_missing && attempt % 2 == 1 ? ENOENT : EACCES;
        });
    DiskReaderOptions options;
    options.file_system = std::move(file_system);
    return options;
  }
};

TEST_F(HostCacheTest, StoredObjectDeletedWhileItsReadBackFailsLeavesNothing) {
  SpillOpenFaults faults;
  Start(2, EvictionPolicy::kFifo, faults.Options());
  ASSERT_THAT(Store("act/a", kObjectBytes, 1, true), IsOk());
  ASSERT_THAT(cache_->Evict("act/a"), IsOk());
  const absl::Time deadline = absl::Now() + kTimeout;
  while (cache_->stats().spilled_objects == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto fetch = Fetch("act/a");  // its read waits at the gate
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_THAT(cache_->Delete("act/a"), IsOk());
  faults.gate->Notify();
  ASSERT_TRUE(fetch->ready.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_THAT(fetch->object, StatusIs(absl::StatusCode::kPermissionDenied));
  // Nothing is left: no memory, no object, no spill file.
  EXPECT_EQ(cache_->stats().used_bytes, 0u);
  EXPECT_EQ(cache_->stats().stored_objects, 0u);
  EXPECT_TRUE(std::filesystem::is_empty(spill_->directory()));
}

TEST_F(HostCacheTest, LoadsOfOneStoredObjectStartedFromFailureCallbacksDoNotCollide) {
  SpillOpenFaults faults;
  faults.then_missing = true;
  faults.gate->Notify();
  Start(2, EvictionPolicy::kFifo, faults.Options());
  for (int round = 0; round < 30; ++round) {
    const std::string key = absl::StrCat("act/", round);
    ASSERT_THAT(Store(key, kObjectBytes, round, true), IsOk());
    ASSERT_THAT(cache_->Evict(key), IsOk());
    const absl::Time deadline = absl::Now() + kTimeout;
    while (cache_->IsResident(key) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    // The first read fails with PERMISSION_DENIED (the object stays) and its callback starts a
    // second load at once, racing the first one's submission; the second loses the object.
    auto final_answer = NewAnswer();
    cache_->Fetch(key, ReadPriority::kDemand, absl::InfiniteFuture(),
                  [this, key, final_answer](absl::StatusOr<HostObject> first) {
                    EXPECT_THAT(first, StatusIs(absl::StatusCode::kPermissionDenied));
                    cache_->Fetch(key, ReadPriority::kDemand, absl::InfiniteFuture(),
                                  [final_answer](absl::StatusOr<HostObject> second) {
                                    final_answer->object = std::move(second);
                                    final_answer->ready.Notify();
                                  });
                  });
    ASSERT_TRUE(final_answer->ready.WaitForNotificationWithTimeout(kTimeout)) << round;
    EXPECT_THAT(final_answer->object, StatusIs(absl::StatusCode::kNotFound)) << round;
  }
  EXPECT_EQ(cache_->stats().used_bytes, 0u);
  EXPECT_EQ(cache_->stats().stored_objects, 0u);
}

TEST_F(HostCacheTest, QueuedPrefetchCanBeCancelled) {
  // One reader thread, small chunks: a large demand read keeps the prefetch queued.
  Start(80, EvictionPolicy::kFifo, ReaderOptions(1, 1, 64 * 1024));
  RegisterModel(2, 32 * kMiB);
  auto big = Fetch("m/blocks.0");
  ASSERT_THAT(cache_->Prefetch("m/blocks.1", absl::InfiniteFuture()), IsOk());
  EXPECT_TRUE(cache_->CancelPrefetch("m/blocks.1"));
  ASSERT_TRUE(big->ready.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(big->object, IsOk());
  EXPECT_FALSE(cache_->IsResident("m/blocks.1"));
  // A cancelled prefetch leaves nothing behind: the object can be fetched normally.
  auto later = FetchNow("m/blocks.1");
  ASSERT_THAT(later, IsOk());
  EXPECT_EQ(FirstPatternMismatch(later->data(), 32 * kMiB, 1), -1);
}

}  // namespace
}  // namespace tierd
