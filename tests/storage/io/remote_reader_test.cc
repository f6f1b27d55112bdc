// The remote reader alone, over a loopback store (tests/s3_stub.h): ranges of a file close
// together are one GET and far ones their own, every range of a request inside a cache chunk is
// one read of that chunk; a request's check decides what the cache keeps and removes; Stop fails
// queued reads at once and ends those in flight.
#include "storage/io/remote_reader.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/s3_stub.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::PatternBytes;
using ::tierd::testing::S3Stub;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StubAnswer;
using ::tierd::testing::StubRequest;

constexpr char kKey[] = "m/model.safetensors";
constexpr uint64_t kChunk = 64 << 10;

class RemoteReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<S3Stub>> stub = S3Stub::Start();
    ASSERT_THAT(stub, IsOk());
    stub_ = *std::move(stub);
    bytes_ = PatternBytes(4 << 20, 1);
    file_.path = absl::StrCat("s3://models/", kKey);
    file_.size = bytes_.size();
    file_.etag = stub_->PutObject("models", kKey, bytes_);
    file_.object = S3Url{"models", kKey};
  }
  // A reader (and a client of its own: a reader's Stop cancels its client for good).
  void StartReader(bool with_cache, RemoteReaderOptions options = {}) {
    reader_.reset();
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(stub_->ClientOptions());
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
    if (with_cache) {
      RemoteCacheOptions cache;
      cache.directory = absl::StrCat(dir_.path(), "/cache");
      cache.budget_bytes = 256 * kChunk;
      cache.chunk_bytes = kChunk;
      absl::StatusOr<std::unique_ptr<RemoteCache>> opened = RemoteCache::Open(cache);
      ASSERT_THAT(opened, IsOk());
      cache_ = *std::move(opened);
    }
    options.streams = 2;
    absl::StatusOr<std::unique_ptr<RemoteReader>> reader =
        RemoteReader::Create(*client_, options, cache_.get());
    ASSERT_THAT(reader, IsOk());
    reader_ = *std::move(reader);
  }
  int Gets() const { return stub_->requests_for("GET", kKey); }

  // Reads `ranges` of the file in one request checked by `check` (none: no check); its outcome,
  // every range's bytes compared with the file's.
  absl::Status Read(const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                    absl::AnyInvocable<absl::Status()> check = nullptr) {
    std::vector<std::string> out;
    out.reserve(ranges.size());
    ReadRequest request;
    for (const auto& [offset, length] : ranges) {
      out.emplace_back(length, '\0');
      request.targets.push_back(ReadTarget{file_.path, offset, length,
                                           reinterpret_cast<uint8_t*>(out.back().data()), false,
                                           &file_});
    }
    absl::Notification done;
    absl::Status status;
    request.done = [&](absl::Status s) {
      status = std::move(s);
      done.Notify();
    };
    request.check = std::move(check);
    reader_->Submit(std::move(request));
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    if (status.ok()) {
      for (size_t i = 0; i < ranges.size(); ++i) {
        EXPECT_TRUE(out[i] == bytes_.substr(ranges[i].first, ranges[i].second)) << i;
      }
    }
    return status;
  }

  testing::TempDir dir_;
  std::unique_ptr<S3Stub> stub_;
  std::string bytes_;
  ModelFile file_;
  std::unique_ptr<S3Client> client_;
  std::unique_ptr<RemoteCache> cache_;
  std::unique_ptr<RemoteReader> reader_;
};

// A strided shard's rows or a many-range derived tensor once cost a GET per range.
TEST_F(RemoteReaderTest, RangesCloseTogetherAreOneGetAndFarOnesTheirOwn) {
  StartReader(/*with_cache=*/false);
  std::vector<std::pair<uint64_t, uint64_t>> rows;
  for (uint64_t i = 0; i < 100; ++i) rows.emplace_back(4096 + i * 3000, 1000);
  ASSERT_THAT(Read(rows), IsOk());
  EXPECT_EQ(Gets(), 1);
  EXPECT_EQ(reader_->stats().parts, 1u);

  // Far apart (1 MiB): a GET each; a range longer than a part: parts of part_bytes.
  ASSERT_THAT(Read({{0, 100}, {1 << 20, 100}, {3 << 20, 100}}), IsOk());
  EXPECT_EQ(Gets(), 4);
  RemoteReaderOptions small;
  small.part_bytes = 256 << 10;
  StartReader(false, small);
  const int before = Gets();
  ASSERT_THAT(Read({{1000, 1 << 20}}), IsOk());
  EXPECT_EQ(Gets() - before, 4);  // 1 MiB in parts of 256 KiB
  // Close ranges fill a part, then start the next: 100 rows over 800 KiB, 32 to a part.
  rows.clear();
  for (uint64_t i = 0; i < 100; ++i) rows.emplace_back(i * 8192, 4096);
  ASSERT_THAT(Read(rows), IsOk());
  EXPECT_EQ(Gets() - before, 4 + 4);
}

TEST_F(RemoteReaderTest, ThroughTheCacheEveryRangeInAChunkIsOneRead) {
  StartReader(/*with_cache=*/true);
  std::vector<std::pair<uint64_t, uint64_t>> rows;
  for (uint64_t i = 0; i < 50; ++i) rows.emplace_back(kChunk + i * 1200, 1000);  // one chunk
  ASSERT_THAT(Read(rows, [] { return absl::OkStatus(); }), IsOk());
  EXPECT_EQ(Gets(), 1);
  EXPECT_EQ(reader_->stats().parts, 1u);
  EXPECT_EQ(cache_->stats().chunks_written, 1u);
  ASSERT_THAT(Read(rows), IsOk());  // from the cache
  EXPECT_EQ(Gets(), 1);
  EXPECT_EQ(reader_->stats().bytes_from_cache, 50u * 1000);
  // A range across two chunks: one read of each.
  ASSERT_THAT(Read({{3 * kChunk - 100, 200}}), IsOk());
  EXPECT_EQ(Gets(), 3);
}

// The read's check (the object's checksum, in the host cache) decides what the cache keeps: a
// bad answer once stayed there, failing every read after, and was served once the model was
// registered again.
TEST_F(RemoteReaderTest, TheRequestsCheckDecidesWhatTheCacheKeeps) {
  StartReader(/*with_cache=*/true);
  const auto bad = [] { return absl::DataLossError("checksum differs"); };
  EXPECT_THAT(Read({{100, 1000}}, bad), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(cache_->stats().chunks_written, 0u);
  EXPECT_EQ(cache_->stats().chunks_discarded, 1u);
  ASSERT_THAT(Read({{100, 1000}}, [] { return absl::OkStatus(); }), IsOk());
  EXPECT_EQ(Gets(), 2);  // fetched again: nothing was kept
  EXPECT_EQ(cache_->stats().chunks_written, 1u);
  // Served from the cache, then failing a check: removed, and fetched again next time.
  EXPECT_THAT(Read({{100, 1000}}, bad), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(Gets(), 2);
  EXPECT_EQ(cache_->stats().chunks_removed, 1u);
  ASSERT_THAT(Read({{100, 1000}}, [] { return absl::OkStatus(); }), IsOk());
  EXPECT_EQ(Gets(), 3);
}

TEST_F(RemoteReaderTest, StopFailsQueuedReadsAtOnceAndEndsThoseInFlight) {
  stub_->SetHook([&](const StubRequest& request) -> std::optional<StubAnswer> {
    StubAnswer answer = stub_->Answer(request);
    answer.silence = absl::Seconds(30);
    return answer;
  });
  RemoteReaderOptions one;
  StartReader(false, one);
  std::vector<absl::Notification> done(6);
  std::vector<absl::Status> outcome(6);
  std::string out(6 * 100, '\0');
  for (int i = 0; i < 6; ++i) {  // two in flight (two streams), four queued
    ReadRequest request;
    request.targets.push_back(ReadTarget{file_.path, i * (1ull << 20), 100,
                                         reinterpret_cast<uint8_t*>(out.data() + i * 100), false,
                                         &file_});
    request.done = [&, i](absl::Status s) {
      outcome[i] = std::move(s);
      done[i].Notify();
    };
    reader_->Submit(std::move(request));
  }
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time stop = absl::Now();
  reader_->Stop();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(done[i].WaitForNotificationWithTimeout(absl::Seconds(5))) << i;
    EXPECT_FALSE(outcome[i].ok()) << i;
  }
  EXPECT_LT(absl::Now() - stop, absl::Seconds(5));
  absl::Notification late;
  ReadRequest request;
  request.targets.push_back(
      ReadTarget{file_.path, 0, 100, reinterpret_cast<uint8_t*>(out.data()), false, &file_});
  request.done = [&](absl::Status s) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
    late.Notify();
  };
  reader_->Submit(std::move(request));
  EXPECT_TRUE(late.HasBeenNotified());
}

}  // namespace
}  // namespace tierd
