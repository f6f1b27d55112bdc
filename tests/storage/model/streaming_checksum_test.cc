// StreamingChecksum on its own: ranges landing in any order, overlapping, from several threads at
// once, give the checksum of the whole object — and none until every byte has landed.
#include "storage/model/streaming_checksum.h"

#include <algorithm>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/model/object_checksum.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

std::vector<uint8_t> RandomBytes(size_t size, uint64_t seed) {
  std::vector<uint8_t> bytes(size);
  ::tierd::testing::FillPattern(bytes.data(), size, seed);
  return bytes;
}

TEST(StreamingChecksumTest, RangesInAnyOrderGiveTheObjectsChecksumOnceAllHaveLanded) {
  const std::vector<uint8_t> object = RandomBytes((5 << 20) + 321, 1);
  // Pieces of 1 byte to 300 KiB, landed in shuffled order; the last one closes the object.
  std::mt19937_64 random(3);
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  for (uint64_t at = 0; at < object.size();) {
    const uint64_t length = std::min<uint64_t>(1 + random() % (300 << 10), object.size() - at);
    pieces.push_back({at, at + length});
    at += length;
  }
  std::shuffle(pieces.begin(), pieces.end(), random);
  StreamingChecksum checksum(object.data(), object.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_FALSE(checksum.Finish().has_value()) << "after " << i << " of " << pieces.size();
    checksum.Landed(pieces[i].first, pieces[i].second);
  }
  ASSERT_TRUE(checksum.Finish().has_value());
  EXPECT_EQ(*checksum.Finish(), ObjectChecksum(object.data(), object.size()));
}

TEST(StreamingChecksumTest, OverlapsRepeatsAndRangesOutsideTheObjectCountOnce) {
  const std::vector<uint8_t> object = RandomBytes(100000, 2);
  StreamingChecksum checksum(object.data(), object.size());
  checksum.Landed(50000, 200000);  // runs past the end: the part inside counts
  checksum.Landed(60000, 70000);   // inside a waiting range
  checksum.Landed(0, 30000);
  checksum.Landed(0, 30000);       // again, once hashed
  checksum.Landed(20000, 40000);   // overlaps what is hashed
  checksum.Landed(45000, 55000);   // bridges into the waiting range
  EXPECT_FALSE(checksum.Finish().has_value());  // [40000, 45000) is missing
  checksum.Landed(39000, 46000);
  ASSERT_TRUE(checksum.Finish().has_value());
  EXPECT_EQ(*checksum.Finish(), ObjectChecksum(object.data(), object.size()));
}

TEST(StreamingChecksumTest, ALandingHashesAtMostTwiceWhatItToldAndFinishHashesTheRest) {
  constexpr uint64_t kMiB = 1 << 20;
  const std::vector<uint8_t> object = RandomBytes(10 * kMiB, 6);
  StreamingChecksum checksum(object.data(), object.size());
  checksum.Landed(kMiB, 10 * kMiB);  // waits for the first MiB
  EXPECT_EQ(checksum.hashed_bytes(), 0u);
  checksum.Landed(0, kMiB);  // closes the gap: hashes its own MiB and one more, no further
  EXPECT_EQ(checksum.hashed_bytes(), 2 * kMiB);
  checksum.Landed(kMiB, 2 * kMiB);  // told again: nothing new to hash, nothing hashed
  EXPECT_EQ(checksum.hashed_bytes(), 2 * kMiB);
  const std::optional<uint64_t> sum = checksum.Finish();  // the other 8 MiB
  EXPECT_EQ(checksum.hashed_bytes(), 10 * kMiB);
  ASSERT_TRUE(sum.has_value());
  EXPECT_EQ(*sum, ObjectChecksum(object.data(), object.size()));
}

TEST(StreamingChecksumTest, AnEmptyObjectHasItsChecksumAtOnce) {
  const uint8_t none = 0;
  StreamingChecksum checksum(&none, 0);
  ASSERT_TRUE(checksum.Finish().has_value());
  EXPECT_EQ(*checksum.Finish(), ObjectChecksum(&none, 0));
}

TEST(StreamingChecksumTest, ThreadsLandingAtOnceGiveTheSameChecksum) {
  const std::vector<uint8_t> object = RandomBytes(24 << 20, 4);
  constexpr uint64_t kPiece = 256 << 10;
  constexpr int kThreads = 4;
  for (int round = 0; round < 5; ++round) {
    StreamingChecksum checksum(object.data(), object.size());
    // Thread t lands pieces t, t + kThreads, ... — interleaved, so that the hashing passes from
    // thread to thread and pieces wait for their predecessors — and then lands the piece before
    // again, which may overlap what another thread is hashing at that moment.
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (uint64_t at = t * kPiece; at < object.size(); at += kThreads * kPiece) {
          checksum.Landed(at, std::min<uint64_t>(at + kPiece, object.size()));
          if (at >= kPiece) checksum.Landed(at - kPiece / 2, at + kPiece / 2);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    ASSERT_TRUE(checksum.Finish().has_value()) << "round " << round;
    EXPECT_EQ(*checksum.Finish(), ObjectChecksum(object.data(), object.size()))
        << "round " << round;
  }
}

// A part told again while the hash of what it overlaps is under way (the lock dropped) must not
// stall the hash: it goes on from where the hashing thread got to.
TEST(StreamingChecksumTest, APartToldAgainWhileItIsBeingHashedDoesNotStallTheHash) {
  constexpr uint64_t kMiB = 1 << 20;
  const std::vector<uint8_t> object = RandomBytes(96 * kMiB, 5);
  StreamingChecksum checksum(object.data(), object.size());
  absl::Notification hashing;
  std::thread first([&] {
    hashing.Notify();
    checksum.Landed(0, 64 * kMiB);  // hashes 64 MiB: some milliseconds
  });
  hashing.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(2));
  checksum.Landed(32 * kMiB, 96 * kMiB);  // overlaps what the first thread is hashing
  first.join();
  ASSERT_TRUE(checksum.Finish().has_value());
  EXPECT_EQ(*checksum.Finish(), ObjectChecksum(object.data(), object.size()));
}

}  // namespace
}  // namespace tierd
