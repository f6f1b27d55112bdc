#include "storage/io/disk_reader.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "testing/fault_injecting_file_system.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::FillPattern;
using ::tierd::testing::IsOk;
using ::tierd::testing::ReaderOptions;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

constexpr absl::Duration kTimeout = absl::Seconds(60);

// The outcome of one request, filled in by its done callback.
struct Outcome {
  absl::Notification finished;
  absl::Status status;
  int calls = 0;
  int order = -1;
};

std::string MakeFile(const std::string& path, uint64_t bytes, uint64_t seed) {
  std::string contents(bytes, '\0');
  FillPattern(contents.data(), bytes, seed);
  EXPECT_THAT(testing::WriteFile(path, contents), IsOk());
  return contents;
}

using ReadLanded = absl::AnyInvocable<void(const uint8_t*, uint64_t) const>;

// What ReadRequest::landed tells of a buffer at `base`: each byte's count, the bytes told that did
// not hold their expected value when told (`expected[i]`: byte i's value, or -1 where no target
// reads), and whether anything was told once `outcome` had its answer.
class LandedRecorder {
 public:
  LandedRecorder(const uint8_t* base, std::vector<int> expected, const Outcome* outcome)
      : base_(base), expected_(std::move(expected)), told_(expected_.size(), 0),
        outcome_(outcome) {}

  ReadLanded Callback() {
    return [this](const uint8_t* bytes, uint64_t length) {
      absl::MutexLock lock(&mu_);
      if (outcome_->finished.HasBeenNotified()) told_after_done_ = true;
      for (uint64_t i = 0; i < length; ++i) {
        const int64_t at = (bytes - base_) + static_cast<int64_t>(i);
        if (at < 0 || static_cast<uint64_t>(at) >= told_.size()) {
          ++told_outside_;
          continue;
        }
        ++told_[at];
        if (expected_[at] != base_[at]) ++wrong_bytes_;
      }
    };
  }

  // Bytes told other than exactly once where a target reads, or at all elsewhere.
  uint64_t MistoldBytes() const {
    absl::MutexLock lock(&mu_);
    uint64_t mistold = told_outside_;
    for (size_t i = 0; i < told_.size(); ++i) mistold += told_[i] != (expected_[i] >= 0 ? 1 : 0);
    return mistold;
  }
  uint64_t wrong_bytes() const {
    absl::MutexLock lock(&mu_);
    return wrong_bytes_;
  }
  bool told_after_done() const {
    absl::MutexLock lock(&mu_);
    return told_after_done_;
  }

 private:
  const uint8_t* const base_;
  const std::vector<int> expected_;
  mutable absl::Mutex mu_;
  std::vector<int> told_ ABSL_GUARDED_BY(mu_);
  uint64_t told_outside_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t wrong_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool told_after_done_ ABSL_GUARDED_BY(mu_) = false;
  const Outcome* const outcome_;
};

class DiskReaderTest : public ::testing::TestWithParam<IoEngine> {
 protected:
  std::unique_ptr<DiskReader> NewReader(DiskReaderOptions options = {}) {
    options.engine = GetParam();
    auto reader = DiskReader::Create(options);
    EXPECT_THAT(reader, IsOk());
    return reader.ok() ? *std::move(reader) : nullptr;
  }

  // Submits `targets` and returns the outcome to wait on.
  std::shared_ptr<Outcome> Read(DiskReader& reader, std::vector<ReadTarget> targets,
                                ReadPriority priority = ReadPriority::kDemand,
                                absl::Time deadline = absl::InfiniteFuture(),
                                DiskReader::RequestId* id = nullptr,
                                ReadLanded landed = nullptr,
                                std::shared_ptr<Outcome> outcome = nullptr) {
    if (outcome == nullptr) outcome = std::make_shared<Outcome>();
    ReadRequest request{std::move(targets), priority, deadline, [this, outcome](absl::Status s) {
                          absl::MutexLock lock(&mu_);
                          outcome->status = s;
                          outcome->order = finished_++;
                          ++outcome->calls;
                          outcome->finished.Notify();
                        }};
    request.landed = std::move(landed);
    const DiskReader::RequestId submitted = reader.Submit(std::move(request));
    if (id != nullptr) *id = submitted;
    return outcome;
  }

  // Reads rows of a strided shard, a range over two chunks and a whole small file from files it
  // writes in `directory`, and checks that ReadRequest::landed told every byte of the targets once,
  // with its value, before done, and nothing else.
  void CheckEveryPartToldOnceBeforeDone(const std::string& directory);

  absl::Mutex mu_;
  int finished_ = 0;
  TempDir dir_;
};

TEST_P(DiskReaderTest, ReadsUnalignedRangesExactly) {
  const std::string path = absl::StrCat(dir_.path(), "/data");
  const std::string contents = MakeFile(path, 37 * kMiB + 123, 1);
  auto reader = NewReader(ReaderOptions(2, 8, kMiB));
  std::mt19937_64 random(7);
  // Each range up to two chunks long, so most span two or three chunks; 120 of them read about
  // 120 MiB in all (compared in place: the sanitizer builds pay for every byte copied).
  std::vector<std::string> buffers(120);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::shared_ptr<Outcome>> outcomes;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const uint64_t offset = random() % contents.size();
    const uint64_t length = std::min<uint64_t>(random() % (2 * kMiB), contents.size() - offset);
    buffers[i].assign(length, '\0');
    ranges.push_back({offset, length});
    outcomes.push_back(
        Read(*reader, {{path, offset, length, reinterpret_cast<uint8_t*>(buffers[i].data())}}));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    ASSERT_TRUE(outcomes[i]->finished.WaitForNotificationWithTimeout(kTimeout));
    ASSERT_THAT(outcomes[i]->status, IsOk());
    ASSERT_TRUE(absl::string_view(buffers[i]) ==
                absl::string_view(contents).substr(ranges[i].first, ranges[i].second))
        << "range " << i;
  }
  const DiskReaderStats stats = reader->stats();
  EXPECT_EQ(stats.engine, GetParam() == IoEngine::kPread ? IoEngine::kPread : IoEngine::kIoUring);
  EXPECT_EQ(stats.requests_completed, buffers.size());
  EXPECT_GE(stats.bytes_read, stats.bytes_delivered);
}

TEST_P(DiskReaderTest, ReadsInPlaceWhenTheDestinationHasAnAlignedWindow) {
  const std::string path = absl::StrCat(dir_.path(), "/window");
  const std::string contents = MakeFile(path, 9 * kMiB + 77, 9);
  // The range starts 1234 bytes into a block and ends at the file's unaligned end; the window
  // around it is page-aligned, as the host cache allocates it.
  const uint64_t offset = 3 * 4096 + 1234;
  const uint64_t length = contents.size() - offset;
  const uint64_t window_bytes = (contents.size() + 4095) / 4096 * 4096 - 3 * 4096;
  auto* window = static_cast<uint8_t*>(std::aligned_alloc(4096, window_bytes));
  auto reader = NewReader(ReaderOptions(2, 4, kMiB));
  auto outcome = Read(*reader, {{path, offset, length, window + 1234, /*aligned_window=*/true}});
  ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(outcome->status, IsOk());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(window) + 1234, length), contents.substr(offset));
  std::free(window);
  EXPECT_EQ(reader->stats().bytes_delivered, length);
}

TEST_P(DiskReaderTest, GathersManyTargetsOfOneRequestIntoPlace) {
  const std::string a = absl::StrCat(dir_.path(), "/a");
  const std::string b = absl::StrCat(dir_.path(), "/b");
  const std::string first = MakeFile(a, 3 * kMiB + 5, 2);
  const std::string second = MakeFile(b, 100, 3);
  std::string object(4 * kMiB, '\0');
  auto* base = reinterpret_cast<uint8_t*>(object.data());
  auto reader = NewReader();
  auto outcome = Read(*reader, {{a, 17, kMiB, base},
                                {b, 0, 100, base + kMiB + 256},
                                {a, 2 * kMiB + 1, kMiB + 4, base + 2 * kMiB},
                                {a, 0, 0, base}});
  ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(outcome->status, IsOk());
  EXPECT_EQ(object.substr(0, kMiB), first.substr(17, kMiB));
  EXPECT_EQ(object.substr(kMiB + 256, 100), second);
  EXPECT_EQ(object.substr(2 * kMiB, kMiB + 4), first.substr(2 * kMiB + 1, kMiB + 4));
}

// ReadRequest::landed: every byte of every target is told once, on a reader thread, already
// holding the file's bytes, and all before done — gathered targets, strided rows and a range over
// two chunks alike (the in-place path: the next test).
TEST_P(DiskReaderTest, TellsEachDeliveredPartOnceBeforeDone) {
  CheckEveryPartToldOnceBeforeDone(dir_.path());
}

// The same from tmpfs, whose files are read from memory in pieces.
TEST_P(DiskReaderTest, TellsEachPartReadFromMemoryOnceBeforeDone) {
  const TempDir shm("/dev/shm");
  CheckEveryPartToldOnceBeforeDone(shm.path());
}

void DiskReaderTest::CheckEveryPartToldOnceBeforeDone(const std::string& directory) {
  const std::string a = absl::StrCat(directory, "/a");
  const std::string b = absl::StrCat(directory, "/b");
  const std::string first = MakeFile(a, 9 * kMiB + 5, 12);
  const std::string second = MakeFile(b, 100, 13);
  std::string object(8 * kMiB, '\0');
  auto* base = reinterpret_cast<uint8_t*>(object.data());
  // Rows of 3000 bytes every 8192 (a strided shard), a range over two chunks, one file's whole
  // contents; each byte of `object` expects its file's byte, or nothing outside the targets.
  std::vector<int> expected(object.size(), -1);
  std::vector<ReadTarget> targets;
  auto add = [&](const std::string& path, const std::string& contents, uint64_t offset,
                 uint64_t length, uint64_t at) {
    targets.push_back({path, offset, length, base + at});
    for (uint64_t i = 0; i < length; ++i) expected[at + i] = static_cast<uint8_t>(contents[offset + i]);
  };
  for (uint64_t row = 0; row < 64; ++row) add(a, first, 5 * kMiB + row * 8192, 3000, row * 3000);
  add(a, first, 17, 2 * kMiB + 9, 3 * kMiB);
  add(b, second, 0, 100, 7 * kMiB);
  auto outcome = std::make_shared<Outcome>();
  LandedRecorder recorder(base, std::move(expected), outcome.get());
  auto reader = NewReader(ReaderOptions(3, 4, kMiB));
  Read(*reader, std::move(targets), ReadPriority::kDemand, absl::InfiniteFuture(), nullptr,
       recorder.Callback(), outcome);
  ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(outcome->status, IsOk());
  EXPECT_FALSE(recorder.told_after_done());
  EXPECT_EQ(recorder.wrong_bytes(), 0u);
  EXPECT_EQ(recorder.MistoldBytes(), 0u)
      << "bytes told not exactly once (targets) or told (elsewhere)";
}

// The in-place path (a target with an aligned window, as the host cache reads a one-extent object
// or a spill file): the window's slack around the range is read too, but only the range is told.
TEST_P(DiskReaderTest, TellsOnlyTheRangeOfAnInPlaceRead) {
  const std::string path = absl::StrCat(dir_.path(), "/window");
  const std::string contents = MakeFile(path, 5 * kMiB + 77, 14);
  const uint64_t offset = 4096 + 1234;
  const uint64_t length = contents.size() - offset;
  const uint64_t window_bytes = (contents.size() + 4095) / 4096 * 4096 - 4096;
  auto* window = static_cast<uint8_t*>(std::aligned_alloc(4096, window_bytes));
  uint8_t* const destination = window + 1234;
  std::vector<int> expected(length);
  for (uint64_t i = 0; i < length; ++i) expected[i] = static_cast<uint8_t>(contents[offset + i]);
  auto outcome = std::make_shared<Outcome>();
  LandedRecorder recorder(destination, std::move(expected), outcome.get());
  auto reader = NewReader(ReaderOptions(2, 4, kMiB));
  Read(*reader, {{path, offset, length, destination, /*aligned_window=*/true}},
       ReadPriority::kDemand, absl::InfiniteFuture(), nullptr, recorder.Callback(), outcome);
  ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(outcome->status, IsOk());
  EXPECT_EQ(recorder.wrong_bytes(), 0u);
  EXPECT_EQ(recorder.MistoldBytes(), 0u) << "bytes told outside the range, or not exactly once";
  std::free(window);
}

// A strided shard's slices: targets close together join large reads, and where most of a read is
// other slices' bytes it goes through the page cache (sparse_bytes_read), so that the node's other
// ranks reading those blocks find them there. Mostly wanted reads stay O_DIRECT.
TEST_P(DiskReaderTest, StridedSlicesAreReadTogetherAndSparseOnesThroughThePageCache) {
  const std::string path = absl::StrCat(dir_.path(), "/rows");
  const uint64_t rows = 256, row_bytes = 8192;
  const std::string contents = MakeFile(path, rows * row_bytes + 100, 6);
  auto reader = NewReader(ReaderOptions(1, 4, kMiB));
  // Slice length → whether it is a sparse read (wanted < 3/4 of what is read).
  for (const auto& [slice, sparse] : {std::pair<uint64_t, bool>{1000, true}, {7000, false}}) {
    SCOPED_TRACE(absl::StrCat("slices of ", slice, " bytes"));
    const DiskReaderStats before = reader->stats();
    std::string shard(rows * slice, '\0');
    std::vector<ReadTarget> targets;
    for (uint64_t row = 0; row < rows; ++row) {
      targets.push_back({path, row * row_bytes + 100, slice,
                         reinterpret_cast<uint8_t*>(shard.data()) + row * slice});
    }
    auto outcome = Read(*reader, std::move(targets));
    ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
    ASSERT_THAT(outcome->status, IsOk());
    for (uint64_t row = 0; row < rows; ++row) {
      ASSERT_EQ(shard.substr(row * slice, slice), contents.substr(row * row_bytes + 100, slice))
          << "row " << row;
    }
    const DiskReaderStats after = reader->stats();
    const uint64_t read = after.bytes_read - before.bytes_read;
    EXPECT_EQ(after.bytes_delivered - before.bytes_delivered, rows * slice);
    EXPECT_LE(read, rows * row_bytes + 4096);  // each block once
    EXPECT_EQ(after.sparse_bytes_read - before.sparse_bytes_read, sparse ? read : 0);
  }
}

TEST_P(DiskReaderTest, FallsBackToBufferedReadsWhereODirectIsRefused) {
  const std::string path = absl::StrCat(dir_.path(), "/refused");
  const std::string contents = MakeFile(path, 2 * kMiB + 3, 4);
  std::string buffer(contents.size() - 10, '\0');
  // A filesystem that refuses O_DIRECT at open, as tmpfs did before Linux 6.6 and overlayfs does.
  auto file_system = std::make_shared<FaultInjectingFileSystem>();
  file_system->FailAlways(FileOperation::kOpenDirect, "", EINVAL);
  DiskReaderOptions options;
  options.file_system = file_system;
  auto reader = NewReader(options);
  auto outcome =
      Read(*reader, {{path, 10, buffer.size(), reinterpret_cast<uint8_t*>(buffer.data())}});
  ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(outcome->status, IsOk());
  EXPECT_EQ(buffer, contents.substr(10));
  EXPECT_EQ(reader->stats().buffered_files, 1u);
}

TEST_P(DiskReaderTest, AFailedReadIsUnavailableAndTheFileIsOpenedAgainForTheNextRequest) {
  const std::string path = absl::StrCat(dir_.path(), "/flaky");
  const std::string contents = MakeFile(path, 64 * 1024, 6);
  std::string buffer(contents.size(), '\0');
  // The first read fails, as a failing disk's EIO would; later ones are real.
  auto file_system = std::make_shared<FaultInjectingFileSystem>();
  auto reads = std::make_shared<std::atomic<int>>(0);
  file_system->SetFault(FileOperation::kRead,
                        [reads](const std::string&) { return reads->fetch_add(1) == 0 ? EIO : 0; });
  DiskReaderOptions options;
  options.direct = false;
  options.file_system = file_system;
  auto reader = NewReader(options);
  auto failed =
      Read(*reader, {{path, 0, buffer.size(), reinterpret_cast<uint8_t*>(buffer.data())}});
  ASSERT_TRUE(failed->finished.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_THAT(failed->status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(failed->status.message()), ::testing::HasSubstr(path));
  auto again = Read(*reader, {{path, 0, buffer.size(), reinterpret_cast<uint8_t*>(buffer.data())}});
  ASSERT_TRUE(again->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(again->status, IsOk());
  EXPECT_EQ(buffer, contents);
  EXPECT_EQ(file_system->calls(FileOperation::kOpenForRead), 2u);
  EXPECT_EQ(file_system->failures(FileOperation::kRead), 1u);
}

// Hands out, for the first open, a descriptor of `directory` instead of the file: reads of it fail
// in the kernel (EISDIR), as a failing disk's EIO would. Later opens are real.
class FirstOpenFailsReads : public FileSystemWrapper {
 public:
  explicit FirstOpenFailsReads(std::string directory)
      : FileSystemWrapper(FileSystem::Default()), directory_(std::move(directory)) {}

  absl::StatusOr<ScopedFd> OpenForRead(const std::string& path,
                                       const OpenForReadOptions& options) override {
    if (opens_.fetch_add(1) == 0) {
      return FileSystemWrapper::OpenForRead(directory_, OpenForReadOptions());
    }
    return FileSystemWrapper::OpenForRead(path, options);
  }

  int opens() const { return opens_.load(); }

 private:
  const std::string directory_;
  std::atomic<int> opens_{0};
};

TEST_P(DiskReaderTest, AReadTheKernelFailsIsUnavailableAndTheFileIsOpenedAgain) {
  const std::string path = absl::StrCat(dir_.path(), "/flaky");
  const std::string contents = MakeFile(path, 64 * 1024, 6);
  std::string buffer(contents.size(), '\0');
  auto file_system = std::make_shared<FirstOpenFailsReads>(dir_.path());
  DiskReaderOptions options;
  options.direct = false;
  options.file_system = file_system;
  auto reader = NewReader(options);
  auto failed =
      Read(*reader, {{path, 0, buffer.size(), reinterpret_cast<uint8_t*>(buffer.data())}});
  ASSERT_TRUE(failed->finished.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_THAT(failed->status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(failed->status.message()), ::testing::HasSubstr(path));
  auto again = Read(*reader, {{path, 0, buffer.size(), reinterpret_cast<uint8_t*>(buffer.data())}});
  ASSERT_TRUE(again->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(again->status, IsOk());
  EXPECT_EQ(buffer, contents);
  EXPECT_EQ(file_system->opens(), 2);
}

// A file on tmpfs is read from memory by the reader thread, without O_DIRECT (which tmpfs takes
// from Linux 6.6 on, and which would bring nothing there), in pieces of 256 KiB told in order as
// each lands — an in-place target's too, and only its range.
TEST_P(DiskReaderTest, ReadsFilesOnTmpfsFromMemoryInPiecesToldAsTheyLand) {
  const TempDir shm("/dev/shm");
  const std::string path = absl::StrCat(shm.path(), "/model");
  const std::string contents = MakeFile(path, 5 * kMiB + 77, 4);
  const uint64_t offset = 4096 + 10;
  const uint64_t length = contents.size() - offset;
  auto* window = static_cast<uint8_t*>(std::aligned_alloc(4096, 6 * kMiB));
  uint8_t* const destination = window + 10;
  absl::Mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> told;  // (offset in the range, length), in order
  ReadLanded landed = [&](const uint8_t* bytes, uint64_t n) {
    absl::MutexLock lock(&mu);
    told.push_back({static_cast<uint64_t>(bytes - destination), n});
  };
  auto reader = NewReader(ReaderOptions(1, 4, 4 * kMiB));  // one thread: the order is the reads'
  auto outcome = Read(*reader, {{path, offset, length, destination, /*aligned_window=*/true}},
                      ReadPriority::kDemand, absl::InfiniteFuture(), nullptr, std::move(landed));
  ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(outcome->status, IsOk());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(destination), length),
            contents.substr(offset));
  absl::MutexLock lock(&mu);
  uint64_t next = 0;
  for (const auto& [at, n] : told) {
    EXPECT_EQ(at, next) << "told out of order, or with a gap";
    EXPECT_GT(n, 0u);
    EXPECT_LE(n, 256u << 10);
    next = at + n;
  }
  EXPECT_EQ(next, length);
  EXPECT_GE(told.size(), length / (256 << 10));
  const DiskReaderStats stats = reader->stats();
  EXPECT_EQ(stats.memory_files, 1u);
  EXPECT_EQ(stats.buffered_files, 0u);
  EXPECT_EQ(stats.bytes_delivered, length);
  std::free(window);
}

// A file on tmpfs that ends before the range does is DATA_LOSS, as on disk; the next request
// opens it again and reads what it holds now.
TEST_P(DiskReaderTest, ATmpfsFileEndingEarlyIsDataLossAndIsOpenedAgain) {
  const TempDir shm("/dev/shm");
  const std::string path = absl::StrCat(shm.path(), "/short");
  std::string contents = MakeFile(path, 3 * kMiB, 5);
  std::string buffer(2 * kMiB, '\0');
  auto reader = NewReader(ReaderOptions(1, 4, kMiB));
  auto outcome =
      Read(*reader, {{path, 2 * kMiB, buffer.size(), reinterpret_cast<uint8_t*>(buffer.data())}});
  ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_THAT(outcome->status, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(outcome->status.message()), ::testing::HasSubstr("ends at byte"));
  contents = MakeFile(path, 4 * kMiB, 6);  // grown since
  auto again =
      Read(*reader, {{path, 2 * kMiB, buffer.size(), reinterpret_cast<uint8_t*>(buffer.data())}});
  ASSERT_TRUE(again->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_THAT(again->status, IsOk());
  EXPECT_EQ(buffer, contents.substr(2 * kMiB, 2 * kMiB));
}

TEST_P(DiskReaderTest, RangePastTheEndOfTheFileIsDataLoss) {
  const std::string path = absl::StrCat(dir_.path(), "/short");
  MakeFile(path, 10000, 5);
  std::string buffer(5000, '\0');
  auto reader = NewReader();
  auto outcome = Read(*reader, {{path, 8000, 5000, reinterpret_cast<uint8_t*>(buffer.data())}});
  ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_THAT(outcome->status, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(outcome->calls, 1);
}

TEST_P(DiskReaderTest, MissingFileIsNotFoundAndEmptyRequestSucceeds) {
  std::string buffer(10, '\0');
  auto reader = NewReader();
  auto missing = Read(*reader, {{absl::StrCat(dir_.path(), "/nope"), 0, 10,
                                 reinterpret_cast<uint8_t*>(buffer.data())}});
  auto empty = Read(*reader, {});
  ASSERT_TRUE(missing->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_TRUE(empty->finished.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_THAT(missing->status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(empty->status, IsOk());
}

// One thread reading one small chunk at a time, behind a large first request: everything submitted
// afterwards is still queued, so the completion order is the queue's order.
class OrderingTest : public DiskReaderTest {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(dir_.path(), "/ordering");
    MakeFile(path_, 64 * kMiB, 6);
    reader_ = NewReader(ReaderOptions(1, 1, 64 * 1024));
    blocker_buffer_.assign(64 * kMiB, '\0');
    blocker_ = Read(*reader_, {{path_, 0, blocker_buffer_.size(), Into(blocker_buffer_)}},
                    ReadPriority::kDemand);
  }
  static uint8_t* Into(std::string& buffer) { return reinterpret_cast<uint8_t*>(buffer.data()); }

  std::string path_;
  std::unique_ptr<DiskReader> reader_;
  std::string blocker_buffer_;
  std::shared_ptr<Outcome> blocker_;
  std::vector<std::string> buffers_ = std::vector<std::string>(8, std::string(kMiB, '\0'));
};

TEST_P(OrderingTest, DemandBeforePrefetchAndEarliestDeadlineFirst) {
  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<Outcome>> prefetches;
  for (int i = 0; i < 6; ++i) {
    // Deadlines in reverse order of submission.
    prefetches.push_back(Read(*reader_, {{path_, 0, kMiB, Into(buffers_[i])}},
                              ReadPriority::kPrefetch, now + absl::Seconds(100 - i)));
  }
  auto demand = Read(*reader_, {{path_, 0, kMiB, Into(buffers_[6])}}, ReadPriority::kDemand);
  for (auto& outcome : prefetches) {
    ASSERT_TRUE(outcome->finished.WaitForNotificationWithTimeout(kTimeout));
  }
  ASSERT_TRUE(demand->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_FALSE(blocker_->finished.HasBeenNotified() && blocker_->order > demand->order)
      << "the blocking request finished too early for the test to mean anything";
  EXPECT_EQ(demand->order, blocker_->order + 1);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(prefetches[i]->order, demand->order + 6 - i) << i;
}

TEST_P(OrderingTest, QueuedRequestCanBeCancelledOrPromoted) {
  DiskReader::RequestId cancelled_id = 0;
  DiskReader::RequestId promoted_id = 0;
  auto cancelled = Read(*reader_, {{path_, 0, kMiB, Into(buffers_[0])}}, ReadPriority::kPrefetch,
                        absl::InfiniteFuture(), &cancelled_id);
  auto other = Read(*reader_, {{path_, 0, kMiB, Into(buffers_[1])}}, ReadPriority::kPrefetch);
  auto promoted = Read(*reader_, {{path_, 0, kMiB, Into(buffers_[2])}}, ReadPriority::kPrefetch,
                       absl::InfiniteFuture(), &promoted_id);
  EXPECT_TRUE(reader_->Cancel(cancelled_id));
  EXPECT_TRUE(cancelled->finished.HasBeenNotified());
  EXPECT_THAT(cancelled->status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(reader_->Cancel(cancelled_id));  // gone
  EXPECT_TRUE(reader_->Reprioritize(promoted_id, ReadPriority::kDemand, absl::InfiniteFuture()));
  ASSERT_TRUE(other->finished.WaitForNotificationWithTimeout(kTimeout));
  ASSERT_TRUE(promoted->finished.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_LT(promoted->order, other->order);
  EXPECT_EQ(cancelled->calls, 1);
  EXPECT_EQ(reader_->stats().requests_cancelled, 1u);
  // A request that has started cannot be cancelled.
  EXPECT_FALSE(reader_->Cancel(promoted_id));
}

TEST_P(OrderingTest, DestructionAnswersQueuedRequestsWithUnavailable) {
  auto queued = Read(*reader_, {{path_, 0, kMiB, Into(buffers_[0])}}, ReadPriority::kPrefetch);
  reader_.reset();
  ASSERT_TRUE(queued->finished.HasBeenNotified());
  ASSERT_TRUE(blocker_->finished.HasBeenNotified());
  EXPECT_THAT(queued->status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(queued->calls, 1);
  EXPECT_EQ(blocker_->calls, 1);
}

TEST_P(DiskReaderTest, ConcurrentSubmittersAllGetTheirBytes) {
  const std::string path = absl::StrCat(dir_.path(), "/shared");
  const std::string contents = MakeFile(path, 8 * kMiB, 8);
  auto reader = NewReader(ReaderOptions(3, 4, 256 * 1024));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 random(t);
      for (int i = 0; i < 50; ++i) {
        const uint64_t offset = random() % contents.size();
        const uint64_t length = std::min<uint64_t>(random() % kMiB, contents.size() - offset);
        std::string buffer(length, '\0');
        auto outcome =
            Read(*reader, {{path, offset, length, reinterpret_cast<uint8_t*>(buffer.data())}},
                 i % 2 ? ReadPriority::kDemand : ReadPriority::kPrefetch);
        if (!outcome->finished.WaitForNotificationWithTimeout(kTimeout) || !outcome->status.ok() ||
            absl::string_view(buffer) != absl::string_view(contents).substr(offset, length)) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Installs a seccomp filter that makes io_uring_setup fail with EPERM, as container runtimes do.
bool BlockIoUring() {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// In a child process (a death test), with io_uring blocked by seccomp: the reader falls back to
// pread and still reads correctly. Exits 0 when all is as expected.
void ReadWithIoUringBlocked(const std::string& path, const std::string& contents) {
  if (!BlockIoUring()) std::_Exit(10);
  auto reader = DiskReader::Create(DiskReaderOptions());
  if (!reader.ok()) std::_Exit(11);
  if ((*reader)->stats().engine != IoEngine::kPread) std::_Exit(12);
  std::string buffer(contents.size() - 100, '\0');
  absl::Notification done;
  absl::Status status;
  (*reader)->Submit({{{path, 100, buffer.size(), reinterpret_cast<uint8_t*>(buffer.data())}},
                     ReadPriority::kDemand,
                     absl::InfiniteFuture(),
                     [&](absl::Status s) {
                       status = s;
                       done.Notify();
                     }});
  done.WaitForNotification();
  std::_Exit(status.ok() && buffer == contents.substr(100) ? 0 : 13);
}

TEST(DiskReaderFallbackTest, FallsBackToPreadWhereSeccompBlocksIoUring) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/blocked");
  const std::string contents = MakeFile(path, 3 * kMiB + 1, 10);
  EXPECT_EXIT(ReadWithIoUringBlocked(path, contents), ::testing::ExitedWithCode(0), "");
}

TEST(DiskReaderOptionsTest, BadOptionsAreInvalidArgument) {
  EXPECT_THAT(DiskReader::Create(ReaderOptions(0, 16, 4 << 20)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DiskReader::Create(ReaderOptions(2, 16, 1000)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DiskReader::Create(ReaderOptions(2, 0, 4 << 20)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskReaderTest,
                         ::testing::Values(IoEngine::kIoUring, IoEngine::kPread),
                         [](const auto& info) {
                           return info.param == IoEngine::kPread ? "Pread" : "IoUring";
                         });
INSTANTIATE_TEST_SUITE_P(Engines, OrderingTest,
                         ::testing::Values(IoEngine::kIoUring, IoEngine::kPread),
                         [](const auto& info) {
                           return info.param == IoEngine::kPread ? "Pread" : "IoUring";
                         });

}  // namespace
}  // namespace tierd
