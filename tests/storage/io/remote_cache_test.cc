// The remote cache on real files: misses fetch whole chunks once and later reads are served from
// disk byte for byte, across a reopen; a fetched chunk is kept only once its read's check passes,
// dropped when it fails, and a kept one whose bytes fail a check is removed; chunks that fail
// their own checks (torn, flipped, another version or endpoint) are fetched again; the budget is
// the directory's, across the caches sharing it, and evicts the least recently used; concurrent
// readers of a chunk, threads or another process, fetch it once, and a reader waits for another's
// fetch only until its deadline; a directory others can write, a link, or a FORMAT this version
// does not know is refused, and one a crash left empty is rebuilt; the temporary files of a cache
// whose process is gone are removed, whatever its pid. Every file and lock goes through the
// FileSystem: a chunk write, a rename or a lock that fails loses nothing and serves the right
// bytes, and a file system short of space keeps no chunk.
#include "storage/io/remote_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/directory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fault_injecting_file_system.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
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

  FakeRemoteFile(const std::string& url, const std::string& etag, uint64_t size, int seed,
                 const std::string& endpoint = "http://127.0.0.1:7480")
      : key{endpoint, url, etag, size}, bytes(size, '\0') {
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

  std::unique_ptr<RemoteCache> Open(uint64_t budget = 64 * kChunk,
                                    std::shared_ptr<FileSystem> file_system = nullptr) {
    RemoteCacheOptions options;
    options.directory = cache_dir();
    options.budget_bytes = budget;
    options.chunk_bytes = kChunk;
    options.file_system = std::move(file_system);
    absl::StatusOr<std::unique_ptr<RemoteCache>> cache = RemoteCache::Open(options);
    EXPECT_THAT(cache, IsOk());
    return cache.ok() ? *std::move(cache) : nullptr;
  }

  // Reads [offset, offset + length) of `file` (inside one chunk) through `cache`, its use of the
  // chunk in `use`; the bytes, or the error.
  static absl::StatusOr<std::string> ReadUnsettled(RemoteCache& cache, FakeRemoteFile& file,
                                                   uint64_t offset, uint64_t length,
                                                   RemoteChunkUse* use,
                                                   absl::Time deadline = absl::InfiniteFuture()) {
    std::string out(length, '\0');
    const RemoteCachePiece piece{offset, length, reinterpret_cast<uint8_t*>(out.data())};
    absl::StatusOr<uint64_t> fetched = cache.Read(
        file.key, offset / kChunk, {piece},
        [&](uint64_t at, uint64_t n, uint8_t* to) { return file.Fetch(at, n, to); }, use, deadline,
        [] { return false; });
    if (!fetched.ok()) return fetched.status();
    return out;
  }
  // The same, the read's check passed: a chunk it fetched is kept.
  static absl::StatusOr<std::string> Read(RemoteCache& cache, FakeRemoteFile& file, uint64_t offset,
                                          uint64_t length) {
    RemoteChunkUse use;
    absl::StatusOr<std::string> bytes = ReadUnsettled(cache, file, offset, length, &use);
    if (bytes.ok()) cache.Keep(use);
    return bytes;
  }

  // The files in the cache's chunk directories, by path: kept chunks, or with `part` those whose
  // names hold it (".pending", ".tmp-").
  std::vector<std::string> ChunkFiles(absl::string_view part = "") const {
    std::vector<std::string> files;
    const std::string root = absl::StrCat(cache_dir(), "/chunks");
    for (const std::string& bucket : ListDirectory(root).value_or(std::vector<std::string>{})) {
      for (const std::string& name :
           ListDirectory(absl::StrCat(root, "/", bucket)).value_or(std::vector<std::string>{})) {
        const bool kept = name.find('.') == std::string::npos;
        if (part.empty() ? kept : absl::StrContains(name, part)) {
          files.push_back(absl::StrCat(root, "/", bucket, "/", name));
        }
      }
    }
    return files;
  }
  // Bytes of every file in the chunk directories.
  uint64_t DirectoryBytes() const {
    uint64_t total = 0;
    const std::string root = absl::StrCat(cache_dir(), "/chunks");
    for (const std::string& bucket : ListDirectory(root).value_or(std::vector<std::string>{})) {
      for (const std::string& name :
           ListDirectory(absl::StrCat(root, "/", bucket)).value_or(std::vector<std::string>{})) {
        struct stat status = {};
        if (::stat(absl::StrCat(root, "/", bucket, "/", name).c_str(), &status) == 0) {
          total += status.st_size;
        }
      }
    }
    return total;
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
  RemoteChunkUse use;
  absl::StatusOr<uint64_t> failed = cache->Read(
      file.key, 0, {RemoteCachePiece{0, 10, reinterpret_cast<uint8_t*>(out.data())}},
      [](uint64_t, uint64_t, uint8_t*) { return absl::UnavailableError("gone"); }, &use,
      absl::InfiniteFuture(), [] { return false; });
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(use.pending);
  EXPECT_TRUE(ChunkFiles().empty());
  EXPECT_TRUE(ChunkFiles(".pending").empty());
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
    RemoteChunkUse use;
    absl::StatusOr<uint64_t> fetched = (*mine)->Read(
        file.key, 0, {RemoteCachePiece{0, kChunk, reinterpret_cast<uint8_t*>(out.data())}},
        [](uint64_t, uint64_t, uint8_t*) { return absl::InternalError("fetched"); }, &use,
        absl::InfiniteFuture(), [] { return false; });
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
      RemoteChunkUse use;
      absl::StatusOr<uint64_t> fetched = cache->Read(
          file.key, 0, {RemoteCachePiece{i * 1000u, 1000, reinterpret_cast<uint8_t*>(out.data())}},
          slow_fetch, &use, absl::InfiniteFuture(), [] { return false; });
      right += fetched.ok() && out == file.bytes.substr(i * 1000, 1000);
      cache->Keep(use);
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

// A writer's temporary file names its cache, whose owner file that cache keeps locked: a process
// that is gone — in this PID namespace or another, whatever pid it had — has it unlocked.
TEST_F(RemoteCacheTest, TheTemporaryFilesOfAGoneCacheAreRemovedOnOpenALiveOnesAreNot) {
  ASSERT_NE(Open(), nullptr);
  const std::string bucket = absl::StrCat(cache_dir(), "/chunks/ab");
  const std::string owners = absl::StrCat(cache_dir(), "/owners");
  // A live cache: its owner file locked (by this test, standing in for another daemon).
  const int live_owner =
      ::open(absl::StrCat(owners, "/1111111111111111").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(live_owner, 0);
  ASSERT_EQ(::flock(live_owner, LOCK_EX | LOCK_NB), 0);
  // A gone one: its owner file unlocked; and one whose owner file is gone too.
  std::ofstream(absl::StrCat(owners, "/2222222222222222")) << "";
  const std::string dead = absl::StrCat(bucket, "/ab00000000000000-0.tmp-2222222222222222-0");
  const std::string orphan = absl::StrCat(bucket, "/ab00000000000000-2.tmp-3333333333333333-0");
  const std::string live = absl::StrCat(bucket, "/ab00000000000000-1.tmp-1111111111111111-9");
  std::ofstream(dead) << "half a chunk";
  std::ofstream(orphan) << "half a chunk";
  std::ofstream(live) << "being written";
  ASSERT_NE(Open(), nullptr);
  struct stat status;
  EXPECT_NE(::stat(dead.c_str(), &status), 0);
  EXPECT_NE(::stat(orphan.c_str(), &status), 0);
  EXPECT_EQ(::stat(live.c_str(), &status), 0);
  EXPECT_NE(::stat(absl::StrCat(owners, "/2222222222222222").c_str(), &status), 0);
  ::close(live_owner);
}

// A chunk fetched for a read is written aside, and kept only once the read's check passed: a bad
// answer — which the read's checksum then refused — once stayed in the cache, failing every later
// read, and after the model was registered again it was served, here and by the node's other
// daemon, as the model's bytes.
TEST_F(RemoteCacheTest, NothingEntersTheCacheUnverifiedAndAChunkThatFailsIsRemoved) {
  FakeRemoteFile file("s3://models/m/a.bin", "\"e\"", 2 * kChunk, 7);
  std::unique_ptr<RemoteCache> cache = Open();
  ASSERT_NE(cache, nullptr);

  // Fetched, its read failed its check: dropped, fetched again next time.
  RemoteChunkUse use;
  ASSERT_THAT(ReadUnsettled(*cache, file, 0, 100, &use), IsOk());
  EXPECT_TRUE(use.pending);
  EXPECT_TRUE(ChunkFiles().empty());
  EXPECT_EQ(ChunkFiles(".pending").size(), 1u);
  cache->Discard(use, /*bad=*/true);
  EXPECT_TRUE(ChunkFiles(".pending").empty());
  EXPECT_TRUE(ChunkFiles().empty());
  EXPECT_EQ(cache->stats().chunks_discarded, 1u);

  // A reader that comes while it is pending is served the pending chunk; the first check that
  // passes keeps it.
  ASSERT_THAT(ReadUnsettled(*cache, file, 0, 100, &use), IsOk());
  EXPECT_EQ(file.fetches, 2);
  RemoteChunkUse second;
  EXPECT_THAT(ReadUnsettled(*cache, file, 200, 100, &second),
              IsOkAndHolds(file.bytes.substr(200, 100)));
  EXPECT_EQ(file.fetches, 2);
  EXPECT_TRUE(second.pending);
  cache->Keep(second);
  EXPECT_EQ(ChunkFiles().size(), 1u);
  cache->Keep(use);  // settled already: nothing to do
  EXPECT_EQ(cache->stats().chunks_written, 1u);

  // Kept, then found bad by a read's check: removed.
  ASSERT_THAT(ReadUnsettled(*cache, file, 0, 100, &use), IsOk());
  EXPECT_FALSE(use.pending);
  cache->Discard(use, /*bad=*/true);
  EXPECT_TRUE(ChunkFiles().empty());
  EXPECT_EQ(cache->stats().chunks_removed, 1u);
  EXPECT_THAT(Read(*cache, file, 0, 100), IsOkAndHolds(file.bytes.substr(0, 100)));
  EXPECT_EQ(file.fetches, 3);

  // A read that failed before checking (its other parts failed): its pending chunk goes, the
  // kept ones stay.
  ASSERT_THAT(ReadUnsettled(*cache, file, kChunk, 100, &use), IsOk());
  cache->Discard(use, /*bad=*/false);
  EXPECT_EQ(ChunkFiles().size(), 1u);
  EXPECT_TRUE(ChunkFiles(".pending").empty());
}

// Two daemons with different --s3-endpoints sharing a directory: one served the other endpoint's
// bytes for the same bucket and key.
TEST_F(RemoteCacheTest, TheSameKeyAtAnotherEndpointIsAnotherFile) {
  FakeRemoteFile here("s3://models/m/a.bin", "\"e\"", kChunk, 8, "https://s3.example.com");
  FakeRemoteFile there("s3://models/m/a.bin", "\"e\"", kChunk, 9, "http://10.0.0.1:7480");
  std::unique_ptr<RemoteCache> cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_THAT(Read(*cache, here, 0, 64), IsOkAndHolds(here.bytes.substr(0, 64)));
  EXPECT_THAT(Read(*cache, there, 0, 64), IsOkAndHolds(there.bytes.substr(0, 64)));
  EXPECT_EQ(here.fetches, 1);
  EXPECT_EQ(there.fetches, 1);
  // One's chunk file in the other's place is refused by its header: both are fetched again (one
  // chunk is gone, the other is of the wrong endpoint).
  std::vector<std::string> chunks = ChunkFiles();
  ASSERT_EQ(chunks.size(), 2u);
  ASSERT_EQ(::rename(chunks[0].c_str(), chunks[1].c_str()), 0);
  EXPECT_THAT(Read(*cache, here, 0, 64), IsOkAndHolds(here.bytes.substr(0, 64)));
  EXPECT_THAT(Read(*cache, there, 0, 64), IsOkAndHolds(there.bytes.substr(0, 64)));
  EXPECT_EQ(here.fetches + there.fetches, 4);
  EXPECT_EQ(cache->stats().chunks_refused, 1u);
}

// The budget is the directory's: each daemon once counted only its own writes, so N daemons on
// one directory took N times the budget.
TEST_F(RemoteCacheTest, TheBudgetHoldsForEveryCacheSharingTheDirectory) {
  std::unique_ptr<RemoteCache> first = Open(/*budget=*/8 * kChunk);
  std::unique_ptr<RemoteCache> second = Open(/*budget=*/8 * kChunk);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  FakeRemoteFile a("s3://models/a/model.safetensors", "\"e\"", 10 * kChunk, 10);
  FakeRemoteFile b("s3://models/b/model.safetensors", "\"e\"", 10 * kChunk, 11);
  for (uint64_t i = 0; i < 10; ++i) {
    ASSERT_THAT(Read(*first, a, i * kChunk, 16), IsOk());
    ASSERT_THAT(Read(*second, b, i * kChunk, 16), IsOk());
    // The directory never holds more than the budget and a chunk being written.
    EXPECT_LE(DirectoryBytes(), 9 * kChunk) << i;
  }
  EXPECT_GT(first->stats().chunks_evicted + second->stats().chunks_evicted, 0u);
}

// A reader whose chunk another reader is fetching waits for it only until its deadline, then
// fetches past the cache; one told to stop stops.
TEST_F(RemoteCacheTest, AWaitForAnotherReadersFetchIsBounded) {
  FakeRemoteFile file("s3://models/m/slow.bin", "\"e\"", kChunk, 12);
  std::unique_ptr<RemoteCache> cache = Open();
  ASSERT_NE(cache, nullptr);
  absl::Notification fetching;
  std::thread slow([&] {
    std::string out(16, '\0');
    RemoteChunkUse use;
    (void)cache->Read(
        file.key, 0, {RemoteCachePiece{0, 16, reinterpret_cast<uint8_t*>(out.data())}},
        [&](uint64_t offset, uint64_t length, uint8_t* destination) {
          fetching.Notify();
          absl::SleepFor(absl::Seconds(3));  // a trickling store
          return file.Fetch(offset, length, destination);
        },
        &use, absl::InfiniteFuture(), [] { return false; });
  });
  fetching.WaitForNotification();
  const absl::Time start = absl::Now();
  RemoteChunkUse use;
  EXPECT_THAT(ReadUnsettled(*cache, file, 100, 16, &use, start + absl::Milliseconds(300)),
              IsOkAndHolds(file.bytes.substr(100, 16)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(file.fetches, 1);  // its own, past the cache: the slow one's is still under way
  std::string out(16, '\0');
  absl::StatusOr<uint64_t> stopped = cache->Read(
      file.key, 0, {RemoteCachePiece{0, 16, reinterpret_cast<uint8_t*>(out.data())}},
      [&](uint64_t offset, uint64_t length, uint8_t* destination) {
        return file.Fetch(offset, length, destination);
      },
      &use, absl::InfiniteFuture(), [] { return true; });
  EXPECT_THAT(stopped, StatusIs(absl::StatusCode::kCancelled));
  slow.join();
}

// A FORMAT left empty by a crash (the first version wrote it without fsync) kept the daemon from
// starting; a chunk size out of bounds in it sized every thread's buffer.
TEST_F(RemoteCacheTest, AnEmptyOrFirstVersionFormatIsRebuiltAnUnboundedOneRefused) {
  FakeRemoteFile file("s3://models/m/a.bin", "\"e\"", kChunk, 13);
  {
    std::unique_ptr<RemoteCache> cache = Open();
    ASSERT_NE(cache, nullptr);
    ASSERT_THAT(Read(*cache, file, 0, 64), IsOk());
  }
  const std::string format = absl::StrCat(cache_dir(), "/FORMAT");
  for (const char* text : {"", "tierd remote cac", "tierd remote cache 1 chunk_bytes=65536\n"}) {
    std::ofstream(format, std::ios::trunc) << text;
    std::unique_ptr<RemoteCache> cache = Open();
    ASSERT_NE(cache, nullptr) << text;
    EXPECT_TRUE(ChunkFiles().empty()) << text;  // rebuilt: nothing of before is trusted
    EXPECT_EQ(testing::ReadWholeFile(format), "tierd remote cache 2 chunk_bytes=65536\n");
    ASSERT_THAT(Read(*cache, file, 0, 64), IsOk());
  }
  RemoteCacheOptions options;
  options.directory = cache_dir();
  options.budget_bytes = 64 * kChunk;
  for (const char* text : {"tierd remote cache 2 chunk_bytes=1\n",
                           "tierd remote cache 2 chunk_bytes=18446744073709551615\n",
                           "tierd remote cache 3 chunk_bytes=65536\n"}) {
    std::ofstream(format, std::ios::trunc) << text;
    EXPECT_THAT(RemoteCache::Open(options), StatusIs(absl::StatusCode::kFailedPrecondition))
        << text;
  }
  options.directory = absl::StrCat(dir_.path(), "/other");
  options.chunk_bytes = 100;
  EXPECT_THAT(RemoteCache::Open(options), StatusIs(absl::StatusCode::kInvalidArgument));

  // The directory, or one of its chunk directories, a symbolic link: refused.
  const std::string link = absl::StrCat(dir_.path(), "/link");
  ASSERT_EQ(::symlink(dir_.path().c_str(), link.c_str()), 0);
  options.directory = link;
  options.chunk_bytes = kChunk;
  EXPECT_THAT(RemoteCache::Open(options), StatusIs(absl::StatusCode::kPermissionDenied));
  std::ofstream(format, std::ios::trunc) << "tierd remote cache 2 chunk_bytes=65536\n";
  const std::string bucket = absl::StrCat(cache_dir(), "/chunks/ab");
  ASSERT_EQ(::rmdir(bucket.c_str()), 0);
  ASSERT_EQ(::symlink(dir_.path().c_str(), bucket.c_str()), 0);
  options.directory = cache_dir();
  EXPECT_THAT(RemoteCache::Open(options), Not(IsOk()));
}

// A chunk whose write fails (a full disk, an I/O error) is served and not kept: the next read
// fetches it again, and once writes pass it is kept. Nothing half-written is left behind.
TEST_F(RemoteCacheTest, AChunkWriteThatFailsServesTheBytesAndKeepsNothing) {
  auto faults = std::make_shared<FaultInjectingFileSystem>();
  std::unique_ptr<RemoteCache> cache = Open(64 * kChunk, faults);
  ASSERT_NE(cache, nullptr);
  FakeRemoteFile file("s3://models/w/model.safetensors", "\"e\"", 2 * kChunk, 20);
  faults->FailAlways(FileOperation::kWrite, ".tmp-", ENOSPC);
  EXPECT_THAT(Read(*cache, file, 10, 100), IsOkAndHolds(file.bytes.substr(10, 100)));
  EXPECT_GT(faults->failures(FileOperation::kWrite), 0u);
  EXPECT_EQ(cache->stats().write_failures, 1u);
  EXPECT_THAT(ChunkFiles(), ::testing::IsEmpty());
  EXPECT_THAT(ChunkFiles(".pending"), ::testing::IsEmpty());
  EXPECT_THAT(ChunkFiles(".tmp-"), ::testing::IsEmpty()) << "a temporary file was left";
  EXPECT_EQ(DirectoryBytes(), 0u);
  EXPECT_THAT(Read(*cache, file, 10, 100), IsOkAndHolds(file.bytes.substr(10, 100)));
  EXPECT_EQ(file.fetches, 2);  // not kept: fetched again

  faults->ClearFaults();
  EXPECT_THAT(Read(*cache, file, 10, 100), IsOkAndHolds(file.bytes.substr(10, 100)));
  EXPECT_THAT(Read(*cache, file, 10, 100), IsOkAndHolds(file.bytes.substr(10, 100)));
  EXPECT_EQ(file.fetches, 3);  // kept at last: the fourth read is a hit
  EXPECT_EQ(ChunkFiles().size(), 1u);
}

// A rename that fails — of the temporary file to its pending name, or of the pending chunk into
// place once its read's check passed — keeps nothing in place; the bytes served are right.
TEST_F(RemoteCacheTest, ARenameThatFailsKeepsNothingInPlace) {
  auto faults = std::make_shared<FaultInjectingFileSystem>();
  std::unique_ptr<RemoteCache> cache = Open(64 * kChunk, faults);
  ASSERT_NE(cache, nullptr);
  FakeRemoteFile file("s3://models/r/model.safetensors", "\"e\"", 2 * kChunk, 21);
  faults->FailAlways(FileOperation::kRename, ".tmp-", EIO);
  EXPECT_THAT(Read(*cache, file, 0, 64), IsOkAndHolds(file.bytes.substr(0, 64)));
  EXPECT_EQ(cache->stats().write_failures, 1u);
  EXPECT_THAT(ChunkFiles(".tmp-"), ::testing::IsEmpty());
  EXPECT_THAT(ChunkFiles(".pending"), ::testing::IsEmpty());

  faults->ClearFaults();
  faults->FailAlways(FileOperation::kRename, ".pending", EIO);
  EXPECT_THAT(Read(*cache, file, kChunk, 64), IsOkAndHolds(file.bytes.substr(kChunk, 64)));
  EXPECT_GT(faults->failures(FileOperation::kRename), 0u);
  EXPECT_THAT(ChunkFiles(), ::testing::IsEmpty()) << "a chunk went into place past a failed rename";
  EXPECT_EQ(cache->stats().chunks_written, 0u);

  faults->ClearFaults();
  EXPECT_THAT(Read(*cache, file, kChunk, 64), IsOkAndHolds(file.bytes.substr(kChunk, 64)));
  EXPECT_EQ(ChunkFiles().size(), 1u);  // the pending chunk, checked by this read, kept now
}

// The locks are the file system's too: a cache that cannot lock its directory does not open, and
// one that cannot take the lock to evict serves its reads without evicting.
TEST_F(RemoteCacheTest, ALockThatFailsRefusesTheOpenOrSkipsTheEviction) {
  auto faults = std::make_shared<FaultInjectingFileSystem>();
  faults->FailAlways(FileOperation::kLock, "/lock", ENOLCK);
  RemoteCacheOptions options;
  options.directory = cache_dir();
  options.budget_bytes = 64 * kChunk;
  options.chunk_bytes = kChunk;
  options.file_system = faults;
  absl::StatusOr<std::unique_ptr<RemoteCache>> refused = RemoteCache::Open(options);
  EXPECT_THAT(refused, Not(IsOk()));
  EXPECT_THAT(refused.status().message(), HasSubstr("/lock"));

  faults->ClearFaults();
  std::unique_ptr<RemoteCache> cache = Open(/*budget=*/4 * kChunk, faults);
  ASSERT_NE(cache, nullptr);
  faults->FailAlways(FileOperation::kLock, "/lock", ENOLCK);
  FakeRemoteFile file("s3://models/l/model.safetensors", "\"e\"", 6 * kChunk, 22);
  for (uint64_t i = 0; i < 6; ++i) {
    EXPECT_THAT(Read(*cache, file, i * kChunk, 32),
                IsOkAndHolds(file.bytes.substr(i * kChunk, 32)));
  }
  EXPECT_EQ(cache->stats().chunks_evicted, 0u);
  EXPECT_GT(faults->failures(FileOperation::kLock), 0u);
  faults->ClearFaults();
  EXPECT_THAT(Read(*cache, file, 0, 32), IsOkAndHolds(file.bytes.substr(0, 32)));
  FakeRemoteFile other("s3://models/l2/model.safetensors", "\"e\"", kChunk, 23);
  EXPECT_THAT(Read(*cache, other, 0, 32), IsOkAndHolds(other.bytes.substr(0, 32)));
  EXPECT_GT(cache->stats().chunks_evicted, 0u);  // the lock had again: back under the budget
  EXPECT_LE(DirectoryBytes(), 5 * kChunk);
}

// A file system that says it is nearly full: chunks are served and none is kept, so the cache
// never takes the last of a disk it shares.
class NearlyFullFileSystem : public FileSystemWrapper {
 public:
  NearlyFullFileSystem() : FileSystemWrapper(FileSystem::Default()) {}
  absl::StatusOr<FileSystemSpace> Space(const Directory&) override {
    return FileSystemSpace{/*free_bytes=*/kChunk, /*total_bytes=*/1ull << 30};
  }
};

TEST_F(RemoteCacheTest, AFileSystemShortOfSpaceKeepsNoChunk) {
  std::unique_ptr<RemoteCache> cache = Open(64 * kChunk, std::make_shared<NearlyFullFileSystem>());
  ASSERT_NE(cache, nullptr);
  FakeRemoteFile file("s3://models/s/model.safetensors", "\"e\"", kChunk, 24);
  EXPECT_THAT(Read(*cache, file, 0, 100), IsOkAndHolds(file.bytes.substr(0, 100)));
  EXPECT_EQ(cache->stats().write_failures, 1u);
  EXPECT_THAT(ChunkFiles(), ::testing::IsEmpty());
  EXPECT_EQ(DirectoryBytes(), 0u);
}

}  // namespace
}  // namespace tierd
