#include "storage/io/detail/uring.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fd_io.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 131 + seed);
  return data;
}

UringTransfer Read(int fd, uint8_t* buffer, uint64_t length, uint64_t offset) {
  UringTransfer read;
  read.fd = fd;
  read.buffer = buffer;
  read.length = length;
  read.offset = offset;
  return read;
}

UringTransfer Write(int fd, const uint8_t* data, uint64_t length, uint64_t offset) {
  UringTransfer write = Read(fd, const_cast<uint8_t*>(data), length, offset);
  write.kind = UringTransfer::Kind::kWrite;
  return write;
}

// Runs one transfer in slot 0 to its end; its error.
int RunOne(Uring& uring, const UringTransfer& transfer) {
  uring.Start(0, transfer);
  int result = 1;
  while (uring.in_flight() > 0) {
    uring.Reap([&](int slot, int error) {
      EXPECT_EQ(slot, 0);
      result = error;
    });
  }
  return result;
}

// Both engines: the ring and the pread/pwrite stand-in.
class UringTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<Uring> NewUring(int slots, std::vector<struct iovec> fixed = {}) {
    if (!GetParam()) return Uring::Synchronous(slots);
    UringOptions options;
    options.slots = slots;
    options.fixed_buffers = std::move(fixed);
    absl::StatusOr<std::unique_ptr<Uring>> uring = Uring::Create(options);
    EXPECT_TRUE(uring.ok()) << uring.status();
    return uring.ok() ? *std::move(uring) : nullptr;
  }

  // Reads into a buffer given at creation or with RegisterBuffers, through a slot it belongs to
  // and one it does not; both land where asked.
  void CheckTransfersWithinRegisteredBuffers(bool register_later);

  ScopedFd OpenFile(const std::string& name, int flags) {
    const int fd = ::open(absl::StrCat(dir_.path(), "/", name).c_str(), flags | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << name;
    return ScopedFd(fd);
  }

  testing::TempDir dir_;
};

TEST_P(UringTest, WritesAndReadsAFileManyTransfersAtOnce) {
  constexpr int kSlots = 8;
  constexpr uint64_t kPiece = 64 << 10;
  constexpr int kPieces = 40;  // five rounds of the slots
  const std::vector<uint8_t> data = Pattern(kPiece * kPieces, 7);
  std::unique_ptr<Uring> uring = NewUring(kSlots);
  ASSERT_NE(uring, nullptr);
  EXPECT_EQ(uring->is_ring(), GetParam());
  ScopedFd file = OpenFile("data", O_RDWR | O_CREAT);

  // Runs `kPieces` transfers made by `make(piece)`, at most kSlots at once.
  auto run_all = [&](auto make) {
    std::vector<int> free_slots(kSlots);
    std::iota(free_slots.begin(), free_slots.end(), 0);
    int next = 0;
    int ended = 0;
    while (ended < kPieces) {
      while (next < kPieces && !free_slots.empty() && uring->CanStart()) {
        uring->Start(free_slots.back(), make(next++));
        free_slots.pop_back();
      }
      EXPECT_LE(uring->in_flight(), kSlots);
      uring->Reap([&](int slot, int error) {
        EXPECT_EQ(error, 0);
        EXPECT_EQ(uring->transfer(slot).transferred, kPiece);
        free_slots.push_back(slot);
        ++ended;
      });
    }
  };
  run_all(
      [&](int piece) { return Write(file.get(), &data[piece * kPiece], kPiece, piece * kPiece); });
  std::vector<uint8_t> back(data.size());
  run_all(
      [&](int piece) { return Read(file.get(), &back[piece * kPiece], kPiece, piece * kPiece); });
  EXPECT_EQ(back, data);
}

TEST_P(UringTest, AReadPastTheEndOfTheFileEndsShortWithoutAnError) {
  const std::vector<uint8_t> data = Pattern(10000, 3);
  ScopedFd file = OpenFile("short", O_RDWR | O_CREAT);
  ASSERT_EQ(::pwrite(file.get(), data.data(), data.size(), 0), ssize_t(data.size()));
  std::unique_ptr<Uring> uring = NewUring(1);
  ASSERT_NE(uring, nullptr);

  std::vector<uint8_t> back(16384, 0xee);
  EXPECT_EQ(RunOne(*uring, Read(file.get(), back.data(), back.size(), 0)), 0);
  EXPECT_EQ(uring->transfer(0).transferred, data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin()));
  EXPECT_EQ(back[data.size()], 0xee);  // nothing past what the file held

  // From beyond the end: nothing, and no error.
  EXPECT_EQ(RunOne(*uring, Read(file.get(), back.data(), 4096, 20000)), 0);
  EXPECT_EQ(uring->transfer(0).transferred, 0u);
}

TEST_P(UringTest, AFailedOperationEndsItsTransferWithItsErrno) {
  ScopedFd read_only = OpenFile("read-only", O_RDONLY | O_CREAT);
  std::unique_ptr<Uring> uring = NewUring(1);
  ASSERT_NE(uring, nullptr);
  const std::vector<uint8_t> data = Pattern(4096, 1);
  EXPECT_EQ(RunOne(*uring, Write(read_only.get(), data.data(), data.size(), 0)), -EBADF);
  EXPECT_EQ(uring->transfer(0).transferred, 0u);
  // The queue goes on after a failure.
  std::vector<uint8_t> back(4096);
  EXPECT_EQ(RunOne(*uring, Read(read_only.get(), back.data(), back.size(), 0)), 0);
}

// Buffers given at creation, or registered later (as a disk reader thread does on its first chunk
// that needs them), are used alike.
TEST_P(UringTest, TransfersWithinARegisteredBufferUseIt) {
  for (const bool later : {false, true}) {
    SCOPED_TRACE(later ? "registered later" : "registered at creation");
    CheckTransfersWithinRegisteredBuffers(later);
  }
}

void UringTest::CheckTransfersWithinRegisteredBuffers(bool register_later) {
  constexpr uint64_t kBytes = 256 << 10;
  std::vector<uint8_t> buffers(2 * kBytes);
  const std::vector<struct iovec> fixed = {{buffers.data(), kBytes},
                                           {buffers.data() + kBytes, kBytes}};
  std::unique_ptr<Uring> uring = NewUring(2, register_later ? std::vector<struct iovec>{} : fixed);
  ASSERT_NE(uring, nullptr);
  if (register_later) {
    EXPECT_FALSE(uring->has_fixed_buffers());
    uring->RegisterBuffers(fixed);
  }
  // As root, or within the memlock limit, the ring registers them; the stand-in has none.
  EXPECT_EQ(uring->has_fixed_buffers(), GetParam());
  const std::vector<uint8_t> data = Pattern(kBytes, 9);
  ScopedFd file = OpenFile("fixed", O_RDWR | O_CREAT);
  ASSERT_EQ(::pwrite(file.get(), data.data(), data.size(), 0), ssize_t(data.size()));

  // Slot 1 reads into its own buffer (a fixed read), slot 0 into slot 1's part (not its own: a
  // plain read); both land where they were asked to.
  uring->Start(1, Read(file.get(), buffers.data() + kBytes, kBytes / 2, 0));
  uring->Start(0, Read(file.get(), buffers.data() + kBytes + kBytes / 2, kBytes / 2, kBytes / 2));
  int ended = 0;
  while (uring->in_flight() > 0) {
    uring->Reap([&](int, int error) {
      EXPECT_EQ(error, 0);
      ++ended;
    });
  }
  EXPECT_EQ(ended, 2);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buffers.begin() + kBytes));
}

INSTANTIATE_TEST_SUITE_P(Engines, UringTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Ring" : "Pread"; });

// A non-blocking pipe gives what a disk rarely does: EAGAIN while it is empty or full, and
// transfers cut short. The ring issues the rest again until each transfer has all its bytes.
// (The stand-in's pread/pwrite do not take pipes: ESPIPE.)
TEST(UringRingTest, EagainAndShortTransfersAreIssuedAgainUntilTheTransferEnds) {
  UringOptions options;
  options.slots = 1;
  absl::StatusOr<std::unique_ptr<Uring>> made = Uring::Create(options);
  ASSERT_TRUE(made.ok()) << made.status();
  Uring& uring = **made;
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_NONBLOCK | O_CLOEXEC), 0);
  ScopedFd read_end(fds[0]), write_end(fds[1]);
  ASSERT_GE(::fcntl(write_end.get(), F_SETPIPE_SZ, 4096), 4096);

  // A read of 12 000 bytes that a writer feeds 1 000 at a time.
  const std::vector<uint8_t> data = Pattern(12000, 5);
  std::thread writer([&] {
    for (size_t at = 0; at < data.size();) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const ssize_t n = ::write(write_end.get(), &data[at], 1000);  // EAGAIN while it is full
      if (n > 0) at += static_cast<size_t>(n);
    }
  });
  std::vector<uint8_t> back(data.size());
  EXPECT_EQ(RunOne(uring, Read(read_end.get(), back.data(), back.size(), 0)), 0);
  writer.join();
  EXPECT_EQ(uring.transfer(0).transferred, data.size());
  EXPECT_EQ(back, data);
  // The pipe holds 4 KiB of the 12 000 bytes: at least three reads, however the writer is timed.
  EXPECT_GE(uring.reissued(), 2u);
  const uint64_t after_read = uring.reissued();

  // A write of 64 KiB into a pipe of 4 KiB that a reader drains 4 KiB at a time.
  const std::vector<uint8_t> big = Pattern(64 << 10, 11);
  std::vector<uint8_t> drained;
  std::thread reader([&] {
    uint8_t piece[4096];
    while (drained.size() < big.size()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const ssize_t n = ::read(read_end.get(), piece, sizeof piece);
      if (n > 0) drained.insert(drained.end(), piece, piece + n);
    }
  });
  EXPECT_EQ(RunOne(uring, Write(write_end.get(), big.data(), big.size(), 0)), 0);
  reader.join();
  EXPECT_EQ(uring.transfer(0).transferred, big.size());
  EXPECT_EQ(drained, big);
  EXPECT_GE(uring.reissued() - after_read, 15u);  // the pipe holds 4 KiB of the 64
}

}  // namespace
}  // namespace tierd
