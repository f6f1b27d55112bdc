// StreamingChecksum on its own: ranges landing in any order, overlapping, from several threads at
// once, give the object's checksum — and none until every byte has landed; bytes hashed by the
// landings that reach them in order, as they land. And the checksum's definition (ObjectChecksum,
// ObjectHasher). Each segment told, once hashed through, to whoever asked.
#include "storage/model/streaming_checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
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
  const std::vector<uint8_t> object = RandomBytes((9 << 20) + 321, 1);  // three segments
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

TEST(StreamingChecksumTest, ALandingHashesWhatItLetsBeHashedInOrderAndFinishHashesNone) {
  constexpr uint64_t kSegment = kChecksumSegmentBytes;
  // Three segments: [0, 4), [4, 8) and [8, 10) MiB.
  const std::vector<uint8_t> object = RandomBytes(2 * kSegment + kSegment / 2, 6);
  StreamingChecksum checksum(object.data(), object.size());
  // The last segment from its start; the second's start has not landed.
  checksum.Landed(kSegment + kSegment / 4, object.size());
  EXPECT_EQ(checksum.hashed_bytes(), kSegment / 2);
  // The first segment, and the second's first byte: the rest of the second waits for the bytes
  // between.
  checksum.Landed(0, kSegment + 1);
  EXPECT_EQ(checksum.hashed_bytes(), kSegment + kSegment / 2 + 1);
  checksum.Landed(0, kSegment);  // told again: nothing new to hash
  EXPECT_EQ(checksum.hashed_bytes(), kSegment + kSegment / 2 + 1);
  EXPECT_FALSE(checksum.Finish().has_value());
  checksum.Landed(kSegment + 1, kSegment + kSegment / 4);  // and what waited after it
  EXPECT_EQ(checksum.hashed_bytes(), object.size());
  const std::optional<uint64_t> sum = checksum.Finish();
  ASSERT_TRUE(sum.has_value());
  EXPECT_EQ(*sum, ObjectChecksum(object.data(), object.size()));
}

// A reader telling a segment's bytes piece by piece as it reads them gets each hashed as it lands,
// while it is in the core's cache — not once the segment is whole; a piece that lands ahead waits
// for the one before it, whose landing hashes both.
TEST(StreamingChecksumTest, PiecesLandingInOrderAreHashedAsTheyLand) {
  constexpr uint64_t kPiece = 256 << 10;
  const std::vector<uint8_t> object = RandomBytes(kChecksumSegmentBytes + 3 * kPiece, 9);
  StreamingChecksum checksum(object.data(), object.size());
  checksum.Landed(0, kPiece);
  EXPECT_EQ(checksum.hashed_bytes(), kPiece);
  checksum.Landed(2 * kPiece, 3 * kPiece);  // ahead of the hashed prefix
  EXPECT_EQ(checksum.hashed_bytes(), kPiece);
  checksum.Landed(kPiece, 2 * kPiece);
  EXPECT_EQ(checksum.hashed_bytes(), 3 * kPiece);
  for (uint64_t at = 3 * kPiece; at < object.size(); at += kPiece) {
    checksum.Landed(at, std::min<uint64_t>(at + kPiece, object.size()));
    EXPECT_EQ(checksum.hashed_bytes(), std::min<uint64_t>(at + kPiece, object.size())) << at;
  }
  const std::optional<uint64_t> sum = checksum.Finish();
  ASSERT_TRUE(sum.has_value());
  EXPECT_EQ(*sum, ObjectChecksum(object.data(), object.size()));
}

// Whoever wants the bytes as they land is told each segment once, when its last bytes are hashed,
// and before Finish returns.
TEST(StreamingChecksumTest, EachSegmentIsToldOnceWhenHashedThrough) {
  constexpr uint64_t kSegment = kChecksumSegmentBytes;
  const std::vector<uint8_t> object = RandomBytes(2 * kSegment + 1000, 11);
  absl::Mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> told;
  StreamingChecksum checksum(object.data(), object.size(), [&](uint64_t begin, uint64_t end) {
    absl::MutexLock lock(&mu);
    told.emplace_back(begin, end);
  });
  auto told_now = [&] {
    absl::MutexLock lock(&mu);
    return told;
  };
  checksum.Landed(kSegment, kSegment + kSegment / 2);  // ahead of its segment's hashed prefix
  checksum.Landed(2 * kSegment, object.size());        // the short last segment, whole
  EXPECT_EQ(told_now(), (std::vector<std::pair<uint64_t, uint64_t>>{{2 * kSegment, object.size()}}));
  checksum.Landed(kSegment / 2, kSegment * 2);  // completes the second segment, not the first
  checksum.Landed(kSegment, kSegment * 2);      // again: not told again
  EXPECT_EQ(told_now().size(), 2u);
  EXPECT_EQ(told_now().back(), std::make_pair(kSegment, 2 * kSegment));
  checksum.Landed(0, kSegment / 2);
  ASSERT_TRUE(checksum.Finish().has_value());
  EXPECT_EQ(told_now().size(), 3u);
  EXPECT_EQ(told_now().back(), std::make_pair(uint64_t{0}, kSegment));
}

// Two threads landing parts of one object hash their own segments: the second's landing hashes
// what it completed before it returns, whether or not the first is still hashing its 64 MiB. (With
// one hashing thread per object it returned at once while the first hashed, leaving its part to
// the first: this failed whenever the first was still hashing then — most runs, as 64 MiB takes
// milliseconds — not every time.)
TEST(StreamingChecksumTest, SegmentsAreHashedByTheirLandingThreadsSideBySide) {
  constexpr uint64_t kSegment = kChecksumSegmentBytes;
  const std::vector<uint8_t> object = RandomBytes(32 * kSegment, 7);
  StreamingChecksum checksum(object.data(), object.size());
  absl::Notification started;
  std::thread first([&] {
    started.Notify();
    checksum.Landed(0, 16 * kSegment);  // 64 MiB to hash on this thread
  });
  started.WaitForNotification();
  checksum.Landed(16 * kSegment, 32 * kSegment);  // hashed here meanwhile, not waiting for it
  EXPECT_GE(checksum.hashed_bytes(), 16 * kSegment);
  first.join();
  EXPECT_EQ(checksum.hashed_bytes(), object.size());
  ASSERT_TRUE(checksum.Finish().has_value());
  EXPECT_EQ(*checksum.Finish(), ObjectChecksum(object.data(), object.size()));
}

// The checksum's definition, which catalogs and durable records persist: an object of one segment
// or less is xxHash3 of its bytes; a longer one's is xxHash3 of its segments' values, little-endian.
TEST(ObjectChecksumTest, IsXxHash3OfTheSegmentsValuesBeyondOneSegment) {
  constexpr uint64_t kSegment = kChecksumSegmentBytes;
  for (const uint64_t size : {uint64_t{0}, uint64_t{1}, kSegment - 1, kSegment}) {
    const std::vector<uint8_t> object = RandomBytes(size, 10 + size);
    EXPECT_EQ(ObjectChecksum(object.data(), size), XXH3_64bits(object.data(), size)) << size;
    EXPECT_EQ(ObjectChecksum(object.data(), size), WholeObjectChecksum(object.data(), size));
  }
  for (const uint64_t size : {kSegment + 1, 3 * kSegment, 3 * kSegment + 12345}) {
    const std::vector<uint8_t> object = RandomBytes(size, 20 + size);
    std::vector<uint8_t> values;
    for (uint64_t at = 0; at < size; at += kSegment) {
      const uint64_t value = XXH3_64bits(object.data() + at, std::min(kSegment, size - at));
      for (int byte = 0; byte < 8; ++byte) values.push_back(static_cast<uint8_t>(value >> (8 * byte)));
    }
    EXPECT_EQ(ObjectChecksum(object.data(), size), XXH3_64bits(values.data(), values.size()))
        << size;
    EXPECT_NE(ObjectChecksum(object.data(), size), WholeObjectChecksum(object.data(), size));
  }
}

// ObjectHasher, fed in pieces that straddle segment boundaries, gives ObjectChecksum, and again
// after Reset.
TEST(ObjectChecksumTest, TheHasherFedInPiecesGivesTheSameChecksum) {
  std::mt19937_64 random(8);
  ObjectHasher hasher;
  for (const uint64_t size : {uint64_t{0}, uint64_t{777}, kChecksumSegmentBytes,
                              2 * kChecksumSegmentBytes + 5, 3 * kChecksumSegmentBytes}) {
    const std::vector<uint8_t> object = RandomBytes(size, 30 + size);
    hasher.Reset();
    for (uint64_t at = 0; at < size;) {
      const uint64_t length = std::min<uint64_t>(1 + random() % (3 << 20), size - at);
      hasher.Update(object.data() + at, length);
      at += length;
    }
    EXPECT_EQ(hasher.Digest(), ObjectChecksum(object.data(), size)) << size;
  }
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
