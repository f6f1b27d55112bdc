// The fixture of host_cache_test: a storage stack on the host device (a real catalog, disk reader,
// spill writer and arena) whose host cache the tests drive, a model of one-tensor blocks to
// register, and the answers of Fetch and ReserveStore to wait on.
#ifndef TIERD_TESTS_STORAGE_HOST_HOST_CACHE_TEST_FIXTURE_H_
#define TIERD_TESTS_STORAGE_HOST_HOST_CACHE_TEST_FIXTURE_H_

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "device/device_wrapper.h"
#include "device/host_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/host/host_cache.h"
#include "storage/storage_stack.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace host_cache_test {

using ::tierd::testing::FillPattern;
using ::tierd::testing::FirstPatternMismatch;
using ::tierd::testing::IsOk;
using ::tierd::testing::ReaderOptions;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

inline constexpr uint64_t kMiB = 1 << 20;

inline constexpr uint64_t kObjectBytes = kMiB;  // one F32 tensor per block
inline constexpr absl::Duration kTimeout = absl::Seconds(60);

// The answer to one Fetch or ReserveStore.
struct Answer {
  absl::Notification ready;
  absl::StatusOr<HostObject> object = absl::UnknownError("no answer");
};

// A device that registers the host arena's first `prompt` pieces (of kObjectBytes) at once and
// makes the others wait for `gate`: an arena on it keeps pinning in the background until the test
// opens the gate. Pieces are told by their address, since several threads pin them in any order;
// the arena always registers its first piece first.
class SlowPinningDevice : public DeviceWrapper {
 public:
  SlowPinningDevice(Device& target, int prompt) : DeviceWrapper(target), prompt_(prompt) {}
  absl::Status RegisterHostMemory(void* data, size_t bytes) override {
    const uintptr_t address = reinterpret_cast<uintptr_t>(data);
    uintptr_t first = 0;
    if (!first_piece_.compare_exchange_strong(first, address) &&
        (address - first) / kObjectBytes >= static_cast<uint64_t>(prompt_)) {
      gate.WaitForNotification();
    }
    return DeviceWrapper::RegisterHostMemory(data, bytes);
  }
  void Open() {
    if (!gate.HasBeenNotified()) gate.Notify();
  }

  absl::Notification gate;

 private:
  const int prompt_;
  std::atomic<uintptr_t> first_piece_{0};  // the address of the arena's first piece
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
  // registers it grouped per block: keys "m/blocks.N". Its files go under `under` (default: the
  // test's directory).
  void RegisterModel(int blocks, uint64_t block_bytes = kObjectBytes, bool verify = false,
                     const std::string& under = "") {
    model_dir_ = absl::StrCat(under.empty() ? dir_.path() : under, "/models/model");
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

  // Flips a byte in the middle of the model's last block (its tensor is the file's last), keeping
  // the file's size and, as a failing disk does, its mtime.
  void FlipByteInTheLastBlock() {
    const std::string path = ModelFilePath();
    ASSERT_THAT(
        testing::FlipByteKeepingMtime(path, std::filesystem::file_size(path) - kObjectBytes / 2),
        IsOk());
  }

  // Model "m" of two blocks registered: block 1 read (its checksum recorded) and evicted, a byte
  // of it flipped on disk; its next read is DATA_LOSS and never handed out, block 0 is unharmed,
  // and each of the three reads was hashed by the reader's threads as its bytes landed (the
  // flipped byte found so, not by a pass afterwards).
  void ExpectAFlippedByteIsDataLoss() {
    {
      auto first = FetchNow("m/blocks.1");  // records the checksum
      ASSERT_THAT(first, IsOk());
      EXPECT_TRUE(HoldsBlock(*first, 1));
    }
    ASSERT_THAT(cache_->Evict("m/blocks.1"), IsOk());
    FlipByteInTheLastBlock();
    EXPECT_THAT(FetchNow("m/blocks.1"), StatusIs(absl::StatusCode::kDataLoss));
    EXPECT_FALSE(cache_->IsResident("m/blocks.1"));
    EXPECT_EQ(cache_->stats().checksum_failures, 1u);
    auto other = FetchNow("m/blocks.0");
    ASSERT_THAT(other, IsOk());
    EXPECT_TRUE(HoldsBlock(*other, 0));
    EXPECT_EQ(cache_->stats().checksums_while_reading, 3u);
  }

  std::shared_ptr<Answer> NewAnswer() {
    auto answer = std::make_shared<Answer>();
    answers_.push_back(answer);
    return answer;
  }

  std::shared_ptr<Answer> Fetch(const std::string& key,
                                ReadPriority priority = ReadPriority::kDemand,
                                HostCache::LandedCallback landed = nullptr) {
    auto answer = NewAnswer();
    cache_->Fetch(
        key, priority, absl::InfiniteFuture(),
        [answer](absl::StatusOr<HostObject> o) {
          answer->object = std::move(o);
          answer->ready.Notify();
        },
        std::move(landed));
    return answer;
  }

  // Marks `copied` as held by a device copy, asks for `key`, checks that the request waits for the
  // copy rather than being answered, then lets the copy give its reference back; returns the
  // answer that came then (ready, unless the cache never answered within kTimeout).
  std::shared_ptr<Answer> FetchWhileACopyHolds(HostObject& copied, const std::string& key) {
    copied.HeldByCopy();
    std::shared_ptr<Answer> answer = Fetch(key);
    EXPECT_FALSE(answer->ready.WaitForNotificationWithTimeout(absl::Milliseconds(200)))
        << key << " was answered while a copy held the room";
    copied.Reset();
    answer->ready.WaitForNotificationWithTimeout(kTimeout);
    return answer;
  }

  absl::StatusOr<HostObject> FetchNow(const std::string& key,
                                      HostCache::LandedCallback landed = nullptr) {
    auto answer = Fetch(key, ReadPriority::kDemand, std::move(landed));
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

}  // namespace host_cache_test
}  // namespace tierd

#endif  // TIERD_TESTS_STORAGE_HOST_HOST_CACHE_TEST_FIXTURE_H_
