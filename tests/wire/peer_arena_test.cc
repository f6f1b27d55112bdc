// Another daemon's shared host arena as a peer sees it (wire/peer_arena.h): mapped read-only,
// registered piece by piece as ranges are wanted (each piece once, whoever wants it), unregistered
// when it goes, and mapped read-write where the device cannot register read-only memory.
#include "wire/peer_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "device/device_factory.h"
#include "device/pinned_host_buffer.h"
#include "device/shared_memory.h"
#include "gtest/gtest.h"
#include "storage/host/host_arena.h"
#include "tests/registration_recording_device.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::RegistrationRecordingDevice;
using ::tierd::testing::StatusIs;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kArenaBytes = 8 * kMiB;
constexpr uint64_t kPiece = kMiB;

// The permissions ("r--s", "rw-s", ...) of the mapping of this process that starts at `address`,
// from /proc/self/maps; empty when no mapping starts there.
std::string MappingPermissions(const void* address) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 2) continue;
    std::vector<std::string> range = absl::StrSplit(fields[0], '-');
    uint64_t start = 0;
    if (range.size() == 2 && absl::SimpleHexAtoi(range[0], &start) &&
        start == reinterpret_cast<uintptr_t>(address)) {
      return fields[1];
    }
  }
  return "";
}

class PeerArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = CreateDevice(testing::DeviceUnderTest());
    ASSERT_THAT(device, IsOk());
    host_ = *std::move(device);
    HostArenaOptions options{kArenaBytes, kPiece, /*pin_threads=*/2};
    options.shared = true;
    // The home daemon's arena; in this same process, so the peer maps it at another address.
    auto home = HostArena::Create(*host_, options);
    ASSERT_THAT(home, IsOk());
    home_ = *std::move(home);
    ASSERT_TRUE(home_->WaitUntilFullyPinned(absl::Seconds(30)));
    device_ = std::make_shared<RegistrationRecordingDevice>(*host_);
  }

  // The peer's view of the whole home arena.
  std::unique_ptr<PeerArena> OpenPeer(uint64_t size = kArenaBytes) {
    auto peer = PeerArena::Open(home_->shared_memory_name(), size, kPiece, device_);
    EXPECT_THAT(peer, IsOk());
    return peer.ok() ? *std::move(peer) : nullptr;
  }

  // The address the peer maps piece `index` at.
  static const void* Piece(const PeerArena& peer, uint64_t index) {
    return peer.data() + index * kPiece;
  }

  std::unique_ptr<Device> host_;  // the device under test: the home's, and the peer's wrapped
  std::unique_ptr<HostArena> home_;
  std::shared_ptr<RegistrationRecordingDevice> device_;
};

TEST_F(PeerArenaTest, RegistersExactlyThePiecesARangeTouchesOnce) {
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  EXPECT_TRUE(device_->registered().empty());  // Open registers nothing

  // [1.5 MiB, 3.5 MiB) touches pieces 1, 2 and 3.
  ASSERT_THAT(peer->EnsureRegistered(kPiece + kPiece / 2, 2 * kPiece), IsOk());
  const std::map<const void*, int> expected = {
      {Piece(*peer, 1), 1}, {Piece(*peer, 2), 1}, {Piece(*peer, 3), 1}};
  EXPECT_EQ(device_->read_only_registered(), expected);
  EXPECT_TRUE(device_->writable_registered().empty());

  // Ranges within registered pieces register nothing more; an empty range nothing at all.
  ASSERT_THAT(peer->EnsureRegistered(2 * kPiece, kPiece), IsOk());
  ASSERT_THAT(peer->EnsureRegistered(3 * kPiece + kPiece - 1, 1), IsOk());
  ASSERT_THAT(peer->EnsureRegistered(6 * kPiece, 0), IsOk());
  EXPECT_EQ(device_->registered(), expected);
  EXPECT_EQ(peer->registered_pieces(), 3u);
}

TEST_F(PeerArenaTest, ConcurrentCallersRegisterEveryPieceOnce) {
  device_->set_delay(absl::Milliseconds(3));
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  constexpr int kThreads = 6;
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&peer, &results, t] {
      // Overlapping ranges, each starting mid-piece, that together cover pieces 0 to 6.
      for (uint64_t start = t % 3; start + 2 <= 7; start += 2) {
        absl::Status status = peer->EnsureRegistered(start * kPiece + 4096, 2 * kPiece - 4096);
        if (!status.ok()) results[t] = status;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& result : results) EXPECT_THAT(result, IsOk());
  std::map<const void*, int> expected;
  for (uint64_t index = 0; index < 7; ++index) expected[Piece(*peer, index)] = 1;
  EXPECT_EQ(device_->registered(), expected);
  EXPECT_EQ(peer->registered_pieces(), 7u);
}

TEST_F(PeerArenaTest, CopiesOutOfRegisteredPiecesReachTheDevice) {
  std::optional<ArenaAllocation> block = home_->Allocate(3 * kMiB + 5 * PageSize());
  ASSERT_TRUE(block.has_value());
  testing::FillPattern(home_->data(*block), block->size(), /*seed=*/31);
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  // From mid-piece, so that the copy is split at a piece's end more than once.
  const uint64_t offset = block->offset() + kPiece / 2;
  const uint64_t bytes = block->size() - kPiece / 2;
  ASSERT_THAT(peer->EnsureRegistered(offset, bytes), IsOk());

  auto slab = device_->AllocateSlab(bytes);
  ASSERT_THAT(slab, IsOk());
  auto back = PinnedHostBuffer::Create(*device_, bytes);
  ASSERT_THAT(back, IsOk());
  auto stream = device_->CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stream, IsOk());
  int copies = 0;
  for (uint64_t done = 0; done < bytes; ++copies) {
    const uint8_t* from = peer->data() + offset + done;
    const uint64_t chunk = std::min(bytes - done, peer->BytesToPieceEnd(from));
    ASSERT_THAT(
        device_->CopyAsync(**stream, static_cast<uint8_t*>((*slab)->data()) + done, from, chunk),
        IsOk());
    done += chunk;
  }
  EXPECT_GE(copies, 4);
  ASSERT_THAT(device_->CopyAsync(**stream, (*back)->data(), (*slab)->data(), bytes), IsOk());
  ASSERT_THAT(device_->SynchronizeStream(**stream), IsOk());
  std::string expected = testing::PatternBytes(block->size(), 31);
  EXPECT_EQ(std::memcmp((*back)->data(), expected.data() + kPiece / 2, bytes), 0);
}

TEST_F(PeerArenaTest, ACallerWaitsForAPieceAnotherThreadIsRegistering) {
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  device_->set_gate_closed(true);
  absl::Status first_result;
  std::thread first([&] { first_result = peer->EnsureRegistered(0, kPiece); });
  while (device_->waiting_at_gate() == 0) absl::SleepFor(absl::Milliseconds(1));

  absl::Notification second_done;
  absl::Status second_result;
  std::thread second([&] {
    second_result = peer->EnsureRegistered(kPiece / 2, 4096);
    second_done.Notify();
  });
  // The second caller neither registers the piece again nor returns before it is registered.
  EXPECT_FALSE(second_done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_EQ(device_->waiting_at_gate(), 1);
  device_->set_gate_closed(false);
  first.join();
  second.join();
  EXPECT_THAT(first_result, IsOk());
  EXPECT_THAT(second_result, IsOk());
  EXPECT_EQ(device_->registered(), (std::map<const void*, int>{{Piece(*peer, 0), 1}}));
}

TEST_F(PeerArenaTest, AFailedRegistrationIsReturnedAndTriedAgainByTheNextCall) {
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  device_->FailNextRegistrations(1);
  EXPECT_THAT(peer->EnsureRegistered(0, 3 * kPiece),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(peer->registered_pieces(), 0u);
  ASSERT_THAT(peer->EnsureRegistered(0, 3 * kPiece), IsOk());
  EXPECT_EQ(peer->registered_pieces(), 3u);
  // The failure settled nothing: the pieces are registered read-only after all.
  EXPECT_EQ(device_->read_only_registered().size(), 3u);
}

TEST_F(PeerArenaTest, ARangeBeyondTheArenaIsOutOfRange) {
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  EXPECT_THAT(peer->EnsureRegistered(kArenaBytes, 1), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(peer->EnsureRegistered(0, kArenaBytes + 1), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(peer->EnsureRegistered(kArenaBytes - 1, ~uint64_t{0}),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(peer->EnsureRegistered(~uint64_t{0}, 2), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(peer->EnsureRegistered(kArenaBytes, 0), IsOk());
  EXPECT_TRUE(device_->registered().empty());
}

TEST_F(PeerArenaTest, OpenChecksTheObjectAndThePieceSize) {
  const std::string& name = home_->shared_memory_name();
  EXPECT_THAT(PeerArena::Open(name, kArenaBytes, 0, device_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PeerArena::Open(name, kArenaBytes, PageSize() + 512, device_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PeerArena::Open(name, 0, kPiece, device_),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PeerArena::Open(name, kArenaBytes + PageSize(), kPiece, device_),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(PeerArena::Open(name + "-gone", kArenaBytes, kPiece, device_),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(PeerArenaTest, MapsTheArenaReadOnlyAndSeesTheHomesBytes) {
  std::optional<ArenaAllocation> block = home_->Allocate(3 * kMiB);
  ASSERT_TRUE(block.has_value());
  testing::FillPattern(home_->data(*block), block->size(), /*seed=*/5);
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  EXPECT_EQ(MappingPermissions(peer->data()), "r--s");
  ASSERT_THAT(peer->EnsureRegistered(block->offset(), block->size()), IsOk());
  EXPECT_EQ(testing::FirstPatternMismatch(peer->data() + block->offset(), block->size(), 5), -1);
  EXPECT_EQ(MappingPermissions(peer->data()), "r--s");
}

TEST_F(PeerArenaTest, TheDestructorUnregistersEveryRegisteredPiece) {
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  ASSERT_THAT(peer->EnsureRegistered(0, 1), IsOk());
  ASSERT_THAT(peer->EnsureRegistered(5 * kPiece, 2 * kPiece), IsOk());
  const std::map<const void*, int> registered = device_->registered();
  EXPECT_EQ(registered.size(), 3u);
  EXPECT_TRUE(device_->unregistered().empty());
  peer.reset();
  EXPECT_EQ(device_->unregistered(), registered);
}

TEST_F(PeerArenaTest, TheBackgroundRegistersEveryPieceOnceBesideTheCallers) {
  device_->set_delay(absl::Milliseconds(3));
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  peer->RegisterAllInBackground();
  peer->RegisterAllInBackground();  // once only
  // A lease's pieces meanwhile, from the far end.
  ASSERT_THAT(peer->EnsureRegistered(6 * kPiece, 2 * kPiece), IsOk());
  for (const absl::Time deadline = absl::Now() + absl::Seconds(30);
       peer->registered_pieces() < kArenaBytes / kPiece && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  std::map<const void*, int> expected;
  for (uint64_t index = 0; index < kArenaBytes / kPiece; ++index) {
    expected[Piece(*peer, index)] = 1;
  }
  EXPECT_EQ(device_->registered(), expected);
}

TEST_F(PeerArenaTest, TheBackgroundRegistersOnlyThePiecesTheHomeHasFaultedIn) {
  // A home that has faulted in pieces 0-3 of 8 so far (sized, nothing reserved beyond them).
  const std::string name = absl::StrCat(SharedMemoryPrefixForPid(::getpid()), "partial");
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kArenaBytes), 0);
  void* home = ::mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(home, MAP_FAILED);
  std::memset(home, 1, 4 * kPiece);
  auto peer = PeerArena::Open(name, kArenaBytes, kPiece, device_);
  ASSERT_THAT(peer, IsOk());
  (*peer)->RegisterAllInBackground();
  auto registered_at_least = [&](uint64_t n) {
    for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
         (*peer)->registered_pieces() < n && absl::Now() < deadline;) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return (*peer)->registered_pieces();
  };
  EXPECT_EQ(registered_at_least(4), 4u);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ((*peer)->registered_pieces(), 4u);  // the others are not allocated by the peer
  // The home pins piece 6: the next pass registers it.
  std::memset(static_cast<uint8_t*>(home) + 6 * kPiece, 1, kPiece);
  EXPECT_EQ(registered_at_least(5), 5u);
  peer->reset();
  ::munmap(home, kArenaBytes);
  ::shm_unlink(name.c_str());
}

TEST_F(PeerArenaTest, DestroyingStopsTheBackgroundRegistration) {
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  device_->set_gate_closed(true);
  peer->RegisterAllInBackground();
  while (device_->waiting_at_gate() == 0) absl::SleepFor(absl::Milliseconds(1));
  std::thread opener([this] {
    absl::SleepFor(absl::Milliseconds(20));
    device_->set_gate_closed(false);
  });
  peer.reset();  // stops after the piece under way, and unregisters what was registered
  opener.join();
  EXPECT_LT(device_->registered().size(), kArenaBytes / kPiece);
  EXPECT_EQ(device_->unregistered(), device_->registered());
}

TEST_F(PeerArenaTest, WhereReadOnlyRegistrationIsUnsupportedItMapsReadWriteAtTheSameAddress) {
  device_->set_read_only_unsupported(true);
  std::optional<ArenaAllocation> block = home_->Allocate(2 * kMiB);
  ASSERT_TRUE(block.has_value());
  testing::FillPattern(home_->data(*block), block->size(), /*seed=*/9);
  std::unique_ptr<PeerArena> peer = OpenPeer();
  ASSERT_NE(peer, nullptr);
  const uint8_t* const data = peer->data();
  EXPECT_EQ(MappingPermissions(data), "r--s");

  ASSERT_THAT(peer->EnsureRegistered(block->offset(), block->size()), IsOk());
  EXPECT_EQ(peer->data(), data);  // addresses handed out stay valid
  EXPECT_EQ(MappingPermissions(data), "rw-s");
  EXPECT_TRUE(device_->read_only_registered().empty());
  const uint64_t pieces =
      (block->offset() + block->size() - 1) / kPiece - block->offset() / kPiece + 1;
  EXPECT_EQ(device_->writable_registered().size(), pieces);
  EXPECT_EQ(testing::FirstPatternMismatch(data + block->offset(), block->size(), 9), -1);
  // The home's later writes show through the new mapping too.
  testing::FillPattern(home_->data(*block), block->size(), /*seed=*/10);
  EXPECT_EQ(testing::FirstPatternMismatch(data + block->offset(), block->size(), 10), -1);

  ASSERT_THAT(peer->EnsureRegistered(7 * kPiece, kPiece), IsOk());
  EXPECT_EQ(device_->writable_registered().size(), pieces + 1);
  peer.reset();
  EXPECT_EQ(device_->unregistered(), device_->writable_registered());
}

TEST_F(PeerArenaTest, BytesToPieceEndStopsAtThePieceOrTheArenasEnd) {
  const uint64_t size = 5 * kPiece + 2 * PageSize();  // the last piece is two pages
  std::unique_ptr<PeerArena> peer = OpenPeer(size);
  ASSERT_NE(peer, nullptr);
  EXPECT_EQ(peer->size(), size);
  EXPECT_EQ(peer->piece_bytes(), kPiece);
  EXPECT_EQ(peer->BytesToPieceEnd(peer->data()), kPiece);
  EXPECT_EQ(peer->BytesToPieceEnd(peer->data() + kPiece - 1), 1u);
  EXPECT_EQ(peer->BytesToPieceEnd(peer->data() + 2 * kPiece + 100), kPiece - 100);
  EXPECT_EQ(peer->BytesToPieceEnd(peer->data() + 5 * kPiece), 2 * PageSize());
  EXPECT_EQ(peer->BytesToPieceEnd(peer->data() + size - 1), 1u);
  ASSERT_THAT(peer->EnsureRegistered(5 * kPiece, 2 * PageSize()), IsOk());
  EXPECT_THAT(peer->EnsureRegistered(size, 1), StatusIs(absl::StatusCode::kOutOfRange));
}

}  // namespace
}  // namespace tierd
