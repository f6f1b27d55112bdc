// host_cache_test's stored objects: visible once committed, replaced, spilled under pressure and
// read back, refused when nothing can spill, and read-backs that fail (a corrupt spill file, a
// spill file that cannot be opened while the object is deleted or fetched again).
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "storage/host/durable_store.h"
#include "storage/model/object_checksum.h"
#include "testing/fault_injecting_file_system.h"
#include "tests/storage/host/host_cache_test_fixture.h"

namespace tierd {
namespace host_cache_test {
namespace {

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

// A stored object of several checksum segments spills and comes back, checked against the
// checksum its spill computed (in segments, as its read back hashes it while landing).
TEST_F(HostCacheTest, AStoredObjectOfSeveralSegmentsSpillsAndComesBackEqual) {
  constexpr uint64_t kBytes = 2 * kChecksumSegmentBytes + 12345;
  Start(24);
  ASSERT_THAT(Store("act/large", kBytes, 41, /*spillable=*/true), IsOk());
  ASSERT_THAT(cache_->Evict("act/large"), IsOk());  // spills
  const absl::Time deadline = absl::Now() + kTimeout;
  while (cache_->IsResident("act/large") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(cache_->stats().spilled_objects, 1u);
  const uint64_t while_reading = cache_->stats().checksums_while_reading;
  absl::StatusOr<HostObject> object = FetchNow("act/large");
  ASSERT_THAT(object, IsOk());
  EXPECT_EQ(FirstPatternMismatch(object->data(), kBytes, 41), -1);
  EXPECT_EQ(cache_->stats().checksums_while_reading, while_reading + 1);
}

TEST_F(HostCacheTest, CacheFullOfUnspillableObjectsSaysResourceExhausted) {
  Start(2);
  ASSERT_THAT(Store("act/a", kObjectBytes, 1, false), IsOk());
  ASSERT_THAT(Store("act/b", kObjectBytes, 2, false), IsOk());
  EXPECT_THAT(Store("act/c", kObjectBytes, 3, true),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(cache_->Evict("act/a"), StatusIs(absl::StatusCode::kFailedPrecondition));
  // Nothing could read it again: a stored object is never discarded.
  EXPECT_THAT(cache_->Discard("act/a"), StatusIs(absl::StatusCode::kFailedPrecondition));
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

// A durable record written before checksums were made of segments holds the whole object's
// xxHash3: its object reads back, checked against that; the same value taken as a checksum of
// segments (what a record written now holds) is a mismatch, so the flag is what decides.
TEST_F(HostCacheTest, AnOlderDaemonsDurableRecordIsCheckedAgainstItsWholeObjectChecksum) {
  constexpr uint64_t kBytes = kChecksumSegmentBytes + kChecksumSegmentBytes / 2;
  Start(8);
  std::string payload(kBytes, '\0');
  ::tierd::testing::FillPattern(reinterpret_cast<uint8_t*>(payload.data()), kBytes, 9);
  const std::string path = absl::StrCat(dir_.path(), "/older.durable");
  {
    std::ofstream file(path, std::ios::binary);
    file << std::string(4096, 'h') << payload;  // the header's page is not read back
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
  ASSERT_NE(WholeObjectChecksum(bytes, kBytes), ObjectChecksum(bytes, kBytes));
  for (const bool whole : {true, false}) {
    const std::string key = whole ? "kv/older" : "kv/misread";
    DurableRecord record;
    record.key = key;
    record.size = kBytes;
    record.path = path;
    record.payload_offset = 4096;
    record.checksum = WholeObjectChecksum(bytes, kBytes);
    record.whole_object_checksum = whole;
    ASSERT_THAT(cache_->AdoptDurable(record), IsOk());
    absl::StatusOr<HostObject> object = FetchNow(key);
    if (whole) {
      ASSERT_THAT(object, IsOk());
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(object->data()), kBytes), payload);
    } else {
      EXPECT_THAT(object, StatusIs(absl::StatusCode::kDataLoss));
    }
  }
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

}  // namespace
}  // namespace host_cache_test
}  // namespace tierd
