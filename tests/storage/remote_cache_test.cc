// The remote cache on real files: misses fetch whole chunks once and later reads are served from
// disk byte for byte, across a reopen; chunks that fail their checks (torn, flipped, another
// version) are fetched again; the budget evicts the least recently used; concurrent readers of a
// chunk, threads or another process, fetch it once; a directory others can write is refused.
#include "storage/remote_cache.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/directory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::StatusIs;

constexpr uint64_t kChunk = 64 << 10;

// A remote file's bytes, and how often (and what) the store was asked for.
struct FakeRemoteFile {
  RemoteChunkKey key;
  std::string bytes;
  std::atomic<int> fetches{0};
  std::atomic<uint64_t> fetched_bytes{0};

  FakeRemoteFile(const std::string& url, const std::string& etag, uint64_t size, int seed)
      : key{url, etag, size}, bytes(size, '\0') {
    for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + seed * 7) >> 3);
  }
  absl::Status Fetch(uint64_t offset, uint64_t length, uint8_t* destination) {
    ++fetches;
    fetched_bytes += length;
    if (offset + length > bytes.size()) return absl::OutOfRangeError("past the end");
    std::memcpy(destination, bytes.data() + offset, length);
    return absl::OkStatus();
  }
};

class RemoteCacheTest : public ::testing::Test {
 protected:
  std::string cache_dir() const { return absl::StrCat(dir_.path(), "/cache"); }

  std::unique_ptr<RemoteCache> Open(uint64_t budget = 64 * kChunk) {
    RemoteCacheOptions options;
    options.directory = cache_dir();
    options.budget_bytes = budget;
    options.chunk_bytes = kChunk;
    absl::StatusOr<std::unique_ptr<RemoteCache>> cache = RemoteCache::Open(options);
    EXPECT_THAT(cache, IsOk());
    return cache.ok() ? *std::move(cache) : nullptr;
  }

  // Reads [offset, offset + length) of `file` through `cache`; the bytes, or the error.
  static absl::StatusOr<std::string> Read(RemoteCache& cache, FakeRemoteFile& file, uint64_t offset,
                                          uint64_t length) {
    std::string out(length, '\0');
    absl::StatusOr<uint64_t> fetched =
        cache.Read(file.key, offset, length, reinterpret_cast<uint8_t*>(out.data()),
                   [&](uint64_t at, uint64_t n, uint8_t* to) { return file.Fetch(at, n, to); });
    if (!fetched.ok()) return fetched.status();
    return out;
  }

  // The chunk files in the cache, by path.
  std::vector<std::string> ChunkFiles() const {
    std::vector<std::string> files;
    const std::string root = absl::StrCat(cache_dir(), "/chunks");
    for (const std::string& bucket : ListDirectory(root).value_or(std::vector<std::string>{})) {
      for (const std::string& name :
           ListDirectory(absl::StrCat(root, "/", bucket)).value_or(std::vector<std::string>{})) {
        files.push_back(absl::StrCat(root, "/", bucket, "/", name));
      }
    }
    return files;
  }

  testing::TempDir dir_;
};

TEST_F(RemoteCacheTest, AMissFetchesTheWholeChunkOnceAndEveryLaterReadIsServedFromDisk) {
  FakeRemoteFile file("s3://models/m/model.safetensors", "\"etag-1\"", 3 * kChunk + 1000, 1);
  std::unique_ptr<RemoteCache> cache = Open();
  ASSERT_NE(cache, nullptr);
  // Ranges inside each chunk, the short last one included.
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {100, 4000}, {kChunk, kChunk}, {2 * kChunk + 7, kChunk - 7}, {3 * kChunk, 1000}, {5, 1}};
  for (const auto& [offset, length] : ranges) {
    EXPECT_THAT(Read(*cache, file, offset, length), IsOkAndHolds(file.bytes.substr(offset, length)))
        << offset;
  }
  EXPECT_EQ(file.fetches, 4);  // one per chunk: the last read is a hit
  EXPECT_EQ(file.fetched_bytes, file.bytes.size());
  EXPECT_EQ(cache->stats().chunks_written, 4u);
  EXPECT_EQ(cache->stats().hit_bytes, 1u);

  // Another cache over the same directory (a restarted daemon) fetches nothing.
  cache.reset();
  cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_GT(cache->stats().cached_bytes, file.bytes.size());
  for (const auto& [offset, length] : ranges) {
    EXPECT_THAT(Read(*cache, file, offset, length),
                IsOkAndHolds(file.bytes.substr(offset, length)));
  }
  EXPECT_EQ(file.fetches, 4);
  EXPECT_EQ(cache->stats().fetched_bytes, 0u);
}

TEST_F(RemoteCacheTest, RangesAcrossChunksAndFailedFetchesAreRefusedAndNothingIsKept) {
  FakeRemoteFile file("s3://models/m/a.bin", "\"e\"", 2 * kChunk, 2);
  std::unique_ptr<RemoteCache> cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_THAT(Read(*cache, file, kChunk - 10, 20), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Read(*cache, file, 2 * kChunk, 1), StatusIs(absl::StatusCode::kInvalidArgument));
  std::string out(10, '\0');
  absl::StatusOr<uint64_t> failed =
      cache->Read(file.key, 0, 10, reinterpret_cast<uint8_t*>(out.data()),
                  [](uint64_t, uint64_t, uint8_t*) { return absl::UnavailableError("gone"); });
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(ChunkFiles().empty());
  EXPECT_THAT(Read(*cache, file, 0, 10), IsOkAndHolds(file.bytes.substr(0, 10)));
  EXPECT_EQ(file.fetches, 1);
}

TEST_F(RemoteCacheTest, ChunksFailingTheirChecksAreFetchedAgainNeverServed) {
  FakeRemoteFile file("s3://models/m/a.bin", "\"v1\"", 2 * kChunk, 3);
  std::unique_ptr<RemoteCache> cache = Open();
  ASSERT_NE(cache, nullptr);
  ASSERT_THAT(Read(*cache, file, 0, kChunk), IsOk());
  std::vector<std::string> chunks = ChunkFiles();
  ASSERT_EQ(chunks.size(), 1u);

  // A flipped byte in the chunk's data.
  {
    std::fstream f(chunks[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x5a' ^ file.bytes[kChunk - 100]);
  }
  EXPECT_THAT(Read(*cache, file, kChunk - 200, 200),
              IsOkAndHolds(file.bytes.substr(kChunk - 200, 200)));
  EXPECT_EQ(file.fetches, 2);
  EXPECT_EQ(cache->stats().chunks_refused, 1u);

  // Torn: the file cut short, as a crash before the data reached the disk could leave it.
  ASSERT_EQ(::truncate(chunks[0].c_str(), 1000), 0);
  EXPECT_THAT(Read(*cache, file, 0, 64), IsOkAndHolds(file.bytes.substr(0, 64)));
  EXPECT_EQ(file.fetches, 3);

  // The same object at another ETag (changed in the store and registered again) is another
  // chunk; that chunk's file renamed over this one's is refused by its header.
  const std::string first_chunk = chunks[0];
  FakeRemoteFile changed("s3://models/m/a.bin", "\"v2\"", 2 * kChunk, 4);
  EXPECT_THAT(Read(*cache, changed, 0, 64), IsOkAndHolds(changed.bytes.substr(0, 64)));
  EXPECT_EQ(changed.fetches, 1);
  chunks = ChunkFiles();
  ASSERT_EQ(chunks.size(), 2u);
  const std::string other_chunk = chunks[0] == first_chunk ? chunks[1] : chunks[0];
  ASSERT_EQ(::rename(other_chunk.c_str(), first_chunk.c_str()), 0);
  EXPECT_THAT(Read(*cache, file, 0, 64), IsOkAndHolds(file.bytes.substr(0, 64)));
  EXPECT_EQ(file.fetches, 4);
  EXPECT_EQ(cache->stats().chunks_refused, 3u);
  EXPECT_THAT(Read(*cache, changed, 0, 64), IsOkAndHolds(changed.bytes.substr(0, 64)));
  EXPECT_EQ(changed.fetches, 2);  // its chunk was moved away
}

TEST_F(RemoteCacheTest, TheBudgetEvictsTheLeastRecentlyUsedChunks) {
  FakeRemoteFile file("s3://models/big/model.safetensors", "\"e\"", 12 * kChunk, 5);
  std::unique_ptr<RemoteCache> cache = Open(/*budget=*/8 * kChunk);
  ASSERT_NE(cache, nullptr);
  for (uint64_t i = 0; i < 7; ++i) {
    ASSERT_THAT(Read(*cache, file, i * kChunk, 16), IsOk());
    absl::SleepFor(absl::Milliseconds(5));  // distinct modification times
  }
  ASSERT_THAT(Read(*cache, file, 0, 16), IsOk());  // chunk 0 is now the most recently used
  EXPECT_EQ(file.fetches, 7);
  for (uint64_t i = 7; i < 12; ++i) {
    ASSERT_THAT(Read(*cache, file, i * kChunk, 16), IsOk());
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_LE(cache->stats().cached_bytes, 8 * kChunk);
  EXPECT_GT(cache->stats().chunks_evicted, 0u);
  EXPECT_LT(ChunkFiles().size(), 8u);
  const int before = file.fetches;
  EXPECT_THAT(Read(*cache, file, 0, 16), IsOkAndHolds(file.bytes.substr(0, 16)));
  EXPECT_THAT(Read(*cache, file, 11 * kChunk, 16),
              IsOkAndHolds(file.bytes.substr(11 * kChunk, 16)));
  EXPECT_EQ(file.fetches, before);  // kept: the recently used ones
  EXPECT_THAT(Read(*cache, file, 1 * kChunk, 16), IsOk());
  EXPECT_EQ(file.fetches, before + 1);  // chunk 1 was the oldest

  // A smaller budget on reopen evicts at once.
  cache.reset();
  cache = Open(/*budget=*/4 * kChunk);
  ASSERT_NE(cache, nullptr);
  EXPECT_LE(cache->stats().cached_bytes, 4 * kChunk);
  EXPECT_LE(ChunkFiles().size(), 3u);
}

TEST_F(RemoteCacheTest, ReadersOfOneChunkFetchItOnceWhetherThreadsOrAnotherProcess) {
  FakeRemoteFile file("s3://models/m/shared.bin", "\"e\"", kChunk, 6);
  // The other process: forked before this one starts any thread; it waits for word that the
  // first fetch is under way, reads the chunk through a cache of its own over the same
  // directory, and exits 0 when it got the bytes without fetching.
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_NE(Open(), nullptr);  // the directory exists before the child opens it
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(go[1]);
    char byte;
    if (::read(go[0], &byte, 1) != 1) ::_exit(2);
    RemoteCacheOptions options;
    options.directory = cache_dir();
    options.budget_bytes = 64 * kChunk;
    options.chunk_bytes = kChunk;
    absl::StatusOr<std::unique_ptr<RemoteCache>> mine = RemoteCache::Open(options);
    if (!mine.ok()) ::_exit(3);
    std::string out(kChunk, '\0');
    absl::StatusOr<uint64_t> fetched =
        (*mine)->Read(file.key, 0, kChunk, reinterpret_cast<uint8_t*>(out.data()),
                      [](uint64_t, uint64_t, uint8_t*) { return absl::InternalError("fetched"); });
    ::_exit(!fetched.ok() ? 4 : *fetched != 0 ? 5 : out != file.bytes ? 6 : 0);
  }
  ::close(go[0]);

  std::unique_ptr<RemoteCache> cache = Open();
  ASSERT_NE(cache, nullptr);
  std::atomic<bool> told{false};
  const auto slow_fetch = [&](uint64_t offset, uint64_t length, uint8_t* destination) {
    if (!told.exchange(true)) {
      EXPECT_EQ(::write(go[1], "g", 1), 1);
    }
    absl::SleepFor(absl::Milliseconds(300));  // the others arrive meanwhile
    return file.Fetch(offset, length, destination);
  };
  std::vector<std::thread> readers;
  std::atomic<int> right{0};
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&, i] {
      std::string out(1000, '\0');
      absl::StatusOr<uint64_t> fetched =
          cache->Read(file.key, i * 1000, 1000, reinterpret_cast<uint8_t*>(out.data()), slow_fetch);
      right += fetched.ok() && out == file.bytes.substr(i * 1000, 1000);
    });
  }
  for (std::thread& reader : readers) reader.join();
  int child_status = 0;
  ASSERT_EQ(::waitpid(child, &child_status, 0), child);
  ::close(go[1]);
  EXPECT_EQ(right, 4);
  EXPECT_EQ(file.fetches, 1);
  ASSERT_TRUE(WIFEXITED(child_status));
  EXPECT_EQ(WEXITSTATUS(child_status), 0);
}

TEST_F(RemoteCacheTest, ADirectoryOthersCanWriteOrAForeignFormatIsRefused) {
  ASSERT_NE(Open(), nullptr);
  ASSERT_EQ(::chmod(cache_dir().c_str(), 0777), 0);
  RemoteCacheOptions options;
  options.directory = cache_dir();
  options.budget_bytes = 64 * kChunk;
  options.chunk_bytes = kChunk;
  absl::StatusOr<std::unique_ptr<RemoteCache>> refused = RemoteCache::Open(options);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(refused.status().message(), HasSubstr("chmod 700"));
  ASSERT_EQ(::chmod(cache_dir().c_str(), 0700), 0);

  std::ofstream(absl::StrCat(cache_dir(), "/FORMAT"), std::ios::trunc) << "something else\n";
  EXPECT_THAT(RemoteCache::Open(options), StatusIs(absl::StatusCode::kFailedPrecondition));

  options.directory = absl::StrCat(dir_.path(), "/small");
  options.budget_bytes = 3 * kChunk;
  EXPECT_THAT(RemoteCache::Open(options), StatusIs(absl::StatusCode::kInvalidArgument));
  options.budget_bytes = 0;  // from the free space
  absl::StatusOr<std::unique_ptr<RemoteCache>> sized = RemoteCache::Open(options);
  ASSERT_THAT(sized, IsOk());
  EXPECT_GE((*sized)->budget_bytes(), 4 * kChunk);
}

TEST_F(RemoteCacheTest, ADeadWritersTemporaryFileIsRemovedOnOpenALiveOnesIsNot) {
  ASSERT_NE(Open(), nullptr);
  const std::string bucket = absl::StrCat(cache_dir(), "/chunks/ab");
  ASSERT_EQ(::mkdir(bucket.c_str(), 0700), 0);
  // A pid that is gone: a child that has exited and been reaped.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string dead = absl::StrCat(bucket, "/ab00000000000000-0.tmp-", gone, "-0");
  const std::string live = absl::StrCat(bucket, "/ab00000000000000-1.tmp-", ::getpid(), "-9");
  std::ofstream(dead) << "half a chunk";
  std::ofstream(live) << "being written";
  ASSERT_NE(Open(), nullptr);
  struct stat status;
  EXPECT_NE(::stat(dead.c_str(), &status), 0);
  EXPECT_EQ(::stat(live.c_str(), &status), 0);
}

}  // namespace
}  // namespace tierd
