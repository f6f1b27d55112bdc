#include "storage/io/remote_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_lock.h"
#include "common/byte_size.h"
#include "common/checked_math.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "storage/io/detail/cache_directory.h"

namespace tierd {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'C', 'H', 'U', 'N', 'K', '2'};
constexpr char kPendingSuffix[] = ".pending";
// Byte-range locks on DIR/lock: one byte per chunk, chunks sharing a byte now and then.
constexpr uint64_t kLockSlots = 1 << 20;
// A write leaves the file system at least this share of its size free, and at most this much.
constexpr uint64_t kFreeSpaceShare = 20;  // 1/20: 5%
constexpr uint64_t kMaxFreeSpaceReserve = 1ull << 30;

// The fixed part of a chunk file's header; the names (endpoint, URL and ETag, each ended by a
// newline) follow it, then the bytes.
struct ChunkHeader {
  char magic[8];
  uint64_t file_size;
  uint64_t chunk_offset;
  uint64_t chunk_length;
  uint64_t checksum;  // XXH3 of the chunk's bytes
  uint64_t names_length;
};
static_assert(sizeof(ChunkHeader) == 48);

std::string Names(const RemoteChunkKey& file) {
  return absl::StrCat(file.endpoint, "\n", file.url, "\n", file.etag, "\n");
}

uint64_t KeyHash(const RemoteChunkKey& file) {
  const std::string key = absl::StrCat(Names(file), file.file_size);
  return XXH3_64bits(key.data(), key.size());
}

std::string ChunkName(uint64_t key_hash, uint64_t index) {
  return absl::StrFormat("%016x-%d", key_hash, index);
}

int BucketOf(uint64_t key_hash) { return static_cast<int>(key_hash >> 56); }

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteCache>> RemoteCache::Open(const RemoteCacheOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CacheDirectory> dir,
                   CacheDirectory::Open(options.directory, options.chunk_bytes,
                                        FileSystemOrDefault(options.file_system)));
  // Counted before the budget is known: a budget of 0 counts what the chunks take as free.
  CacheSweep counted;
  {
    ASSIGN_OR_RETURN(ScopedFd sweeping, dir->LockExclusive());
    counted = dir->Sweep(UINT64_MAX);
  }
  uint64_t budget = options.budget_bytes;
  if (budget == 0) {
    ASSIGN_OR_RETURN(const auto space, dir->Space());
    budget = SaturatingAdd(space.free_bytes, counted.bytes) / 10 * 8;
  }
  const uint64_t chunk_bytes = dir->chunk_bytes();
  if (budget < 4 * chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the remote cache's budget in ", options.directory, " (", budget,
                     " bytes) must hold at least 4 chunks of ", chunk_bytes, " bytes"));
  }
  std::unique_ptr<RemoteCache> cache(new RemoteCache(std::move(dir), budget));
  {
    absl::MutexLock hold(&cache->mu_);
    cache->stats_.cached_bytes = counted.bytes;
  }
  if (counted.bytes > budget) cache->EvictDownTo(budget / 10 * 9);
  TIERD_LOG(INFO) << "remote cache " << options.directory << ": " << FormatByteSize(counted.bytes)
                  << " cached, budget " << FormatByteSize(budget) << ", chunks of "
                  << FormatByteSize(chunk_bytes)
                  << (counted.reaped > 0
                          ? absl::StrCat(", ", counted.reaped, " file(s) of gone daemons removed")
                          : "");
  return cache;
}

RemoteCache::RemoteCache(std::unique_ptr<CacheDirectory> directory, uint64_t budget_bytes)
    : dir_(std::move(directory)), budget_bytes_(budget_bytes), chunk_bytes_(dir_->chunk_bytes()) {}

RemoteCache::~RemoteCache() = default;

absl::StatusOr<uint64_t> RemoteCache::Read(const RemoteChunkKey& file, uint64_t index,
                                           absl::Span<const RemoteCachePiece> pieces, Fetch fetch,
                                           RemoteChunkUse* use, absl::Time deadline,
                                           absl::FunctionRef<bool()> stopped) {
  const std::optional<uint64_t> chunk_offset = CheckedMul(index, chunk_bytes_);
  if (!chunk_offset || *chunk_offset >= file.file_size || pieces.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " of ", file.url,
                                                   " is past its end, or none of it is asked"));
  }
  const uint64_t chunk_length = std::min(chunk_bytes_, file.file_size - *chunk_offset);
  uint64_t asked = 0;
  for (const RemoteCachePiece& piece : pieces) {
    if (piece.length == 0 || piece.offset < *chunk_offset ||
        piece.offset - *chunk_offset > chunk_length ||
        piece.length > chunk_length - (piece.offset - *chunk_offset)) {
      return absl::InvalidArgumentError(absl::StrCat("bytes ", piece.offset, "+", piece.length,
                                                     " of ", file.url, " are not inside chunk ",
                                                     index, " of it"));
    }
    asked += piece.length;
  }
  const uint64_t key_hash = KeyHash(file);
  const int bucket = BucketOf(key_hash);
  const std::string name = ChunkName(key_hash, index);
  const std::string pending_name = absl::StrCat(name, kPendingSuffix);
  *use = RemoteChunkUse{key_hash, index, false, 0};
  // One piece that is the whole chunk is read straight into its destination; any other goes
  // through a buffer of this thread's, kept for its next read (at most kMaxCacheChunkBytes).
  uint8_t* chunk = pieces[0].destination;
  if (pieces.size() != 1 || pieces[0].offset != *chunk_offset || pieces[0].length != chunk_length) {
    thread_local std::vector<uint8_t> buffer;
    if (buffer.size() < chunk_length) buffer.resize(chunk_length);
    chunk = buffer.data();
  }
  const auto copy_out = [&] {
    if (chunk == pieces[0].destination && pieces.size() == 1) return;
    for (const RemoteCachePiece& piece : pieces) {
      std::memcpy(piece.destination, chunk + (piece.offset - *chunk_offset), piece.length);
    }
  };
  const auto serve = [&] {
    copy_out();
    absl::MutexLock lock(&mu_);
    stats_.hit_bytes += asked;
    return uint64_t{0};
  };
  // In place, else pending: `report` says a failing one is logged.
  const auto look = [&](bool report) {
    if (ReadChunk(name, bucket, file, *chunk_offset, chunk_length, chunk, report)) return true;
    std::optional<uint64_t> inode =
        ReadChunk(pending_name, bucket, file, *chunk_offset, chunk_length, chunk, report);
    if (!inode) return false;
    use->pending = true;
    use->pending_inode = *inode;
    return true;
  };
  const auto fetch_alone = [&]() -> absl::StatusOr<uint64_t> {
    RETURN_IF_ERROR(fetch(*chunk_offset, chunk_length, chunk));
    copy_out();
    absl::MutexLock hold(&mu_);
    stats_.fetched_bytes += chunk_length;
    return chunk_length;
  };
  if (look(/*report=*/false)) return serve();

  // A miss: one fetch of this chunk at a time, across this node's daemons.
  absl::StatusOr<ScopedFd> lock = dir_->OpenLockFile();
  absl::Status locked = lock.status();
  if (lock.ok()) {
    locked = LockByte(lock->get(), static_cast<off_t>((key_hash ^ index) % kLockSlots), deadline,
                      stopped);
  }
  if (absl::IsCancelled(locked)) return locked;
  if (!locked.ok()) {  // the cache's trouble, or a reader that holds the chunk too long
    TIERD_LOG_EVERY_N_SEC(WARNING, 10) << "remote cache: fetching past it: " << locked;
    return fetch_alone();
  }
  if (look(/*report=*/true)) return serve();
  ASSIGN_OR_RETURN(const uint64_t fetched, fetch_alone());
  if (std::optional<uint64_t> inode =
          WritePending(pending_name, bucket, file, *chunk_offset, chunk, chunk_length)) {
    use->pending = true;
    use->pending_inode = *inode;
  }
  return fetched;
}

void RemoteCache::Keep(const RemoteChunkUse& use) {
  if (!use.pending) return;
  const int bucket = BucketOf(use.key_hash);
  const std::string name = ChunkName(use.key_hash, use.index);
  const std::string pending_name = absl::StrCat(name, kPendingSuffix);
  FileSystem& fs = dir_->file_system();
  const Directory& at = dir_->bucket(bucket);
  absl::StatusOr<EntryStatus> pending = fs.StatAt(at, pending_name);
  if (!pending.ok() || pending->inode != use.pending_inode) {
    return;  // kept, dropped or replaced by another read meanwhile
  }
  // What the rename replaces (a chunk kept by another daemon meanwhile) leaves the count.
  const absl::StatusOr<EntryStatus> replaced = fs.StatAt(at, name);
  if (absl::Status renamed = fs.RenameAt(at, pending_name, name); !renamed.ok()) {
    // Settled by another read meanwhile, or the file system's trouble: the pending chunk is
    // dropped by a later read or sweep.
    if (!absl::IsNotFound(renamed)) {
      TIERD_LOG_EVERY_N_SEC(WARNING, 10) << "remote cache: not keeping a chunk: " << renamed;
    }
    return;
  }
  if (replaced.ok()) (void)dir_->AddUsage(-static_cast<int64_t>(replaced->size));
  absl::MutexLock lock(&mu_);
  ++stats_.chunks_written;
}

void RemoteCache::Discard(const RemoteChunkUse& use, bool bad) {
  const int bucket = BucketOf(use.key_hash);
  const std::string name = ChunkName(use.key_hash, use.index);
  const bool dropped =
      use.pending && RemoveFile(bucket, absl::StrCat(name, kPendingSuffix), use.pending_inode);
  const bool removed = bad && RemoveFile(bucket, name, 0);
  if (bad) {
    TIERD_LOG(WARNING) << "remote cache: " << dir_->Describe(bucket, name)
                       << " served bytes that failed their read's check; "
                       << (dropped || removed ? "removed" : "already gone");
  }
  absl::MutexLock lock(&mu_);
  stats_.chunks_discarded += dropped;
  stats_.chunks_removed += removed;
}

bool RemoteCache::RemoveFile(int bucket, const std::string& name, uint64_t inode) {
  FileSystem& fs = dir_->file_system();
  const absl::StatusOr<EntryStatus> status = fs.StatAt(dir_->bucket(bucket), name);
  if (!status.ok() || (inode != 0 && status->inode != inode)) return false;
  if (!fs.RemoveAt(dir_->bucket(bucket), name).ok()) return false;
  (void)dir_->AddUsage(-static_cast<int64_t>(status->size));
  return true;
}

std::optional<uint64_t> RemoteCache::ReadChunk(const std::string& name, int bucket,
                                               const RemoteChunkKey& file, uint64_t chunk_offset,
                                               uint64_t chunk_length, uint8_t* chunk, bool report) {
  FileSystem& fs = dir_->file_system();
  absl::StatusOr<ScopedFd> opened = fs.OpenAt(dir_->bucket(bucket), name, O_RDONLY, 0);
  if (!opened.ok()) return std::nullopt;  // not cached (or not readable: fetched again)
  const ScopedFd fd = *std::move(opened);
  const std::string path = dir_->Describe(bucket, name);
  const auto refuse = [&](absl::string_view why) -> std::optional<uint64_t> {
    if (!report) return std::nullopt;
    TIERD_LOG(WARNING) << "remote cache: " << path << " " << why << "; fetching it again";
    absl::MutexLock lock(&mu_);
    ++stats_.chunks_refused;
    return std::nullopt;
  };
  struct stat status = {};
  if (::fstat(fd.get(), &status) != 0 || !S_ISREG(status.st_mode)) {
    return refuse("is not a regular file");
  }
  if (absl::Status announced = fs.BeforeRead(path); !announced.ok()) {
    TIERD_LOG_EVERY_N_SEC(WARNING, 10) << "remote cache: " << announced;
    return std::nullopt;
  }
  const std::string names = Names(file);
  ChunkHeader header;
  absl::StatusOr<size_t> got = ReadUpTo(fd.get(), &header, sizeof(header), path);
  if (!got.ok() || *got != sizeof(header) || std::memcmp(header.magic, kMagic, 8) != 0 ||
      header.names_length != names.size()) {
    return refuse("has no header of a chunk of this file");
  }
  std::string stored(names.size(), '\0');
  got = ReadUpTo(fd.get(), stored.data(), stored.size(), path);
  if (!got.ok() || *got != stored.size() || stored != names || header.file_size != file.file_size ||
      header.chunk_offset != chunk_offset || header.chunk_length != chunk_length) {
    return refuse("is a chunk of another file, version, endpoint or range");
  }
  got = ReadUpTo(fd.get(), chunk, chunk_length, path);
  uint8_t past_end;
  if (!got.ok() || *got != chunk_length ||
      ReadUpTo(fd.get(), &past_end, 1, path).value_or(1) != 0) {
    return refuse("does not hold the chunk's length");
  }
  if (XXH3_64bits(chunk, chunk_length) != header.checksum) {
    return refuse("does not match its checksum");
  }
  // A hit is a use: the eviction order follows modification times.
  ::futimens(fd.get(), nullptr);
  return static_cast<uint64_t>(status.st_ino);
}

std::optional<uint64_t> RemoteCache::WritePending(const std::string& name, int bucket,
                                                  const RemoteChunkKey& file, uint64_t chunk_offset,
                                                  const uint8_t* chunk, uint64_t chunk_length) {
  static std::atomic<uint64_t> next_temporary{0};
  const std::string names = Names(file);
  const uint64_t bytes = sizeof(ChunkHeader) + names.size() + chunk_length;
  if (!Reserve(bytes)) {
    absl::MutexLock lock(&mu_);
    ++stats_.write_failures;
    return std::nullopt;
  }
  FileSystem& fs = dir_->file_system();
  const Directory& at = dir_->bucket(bucket);
  const std::string temporary =
      absl::StrCat(name, ".tmp-", dir_->owner(), "-", next_temporary.fetch_add(1));
  ChunkHeader header = {};
  std::memcpy(header.magic, kMagic, 8);
  header.file_size = file.file_size;
  header.chunk_offset = chunk_offset;
  header.chunk_length = chunk_length;
  header.checksum = XXH3_64bits(chunk, chunk_length);
  header.names_length = names.size();
  const std::string temporary_path = at.PathOf(temporary);
  uint64_t inode = 0;
  absl::StatusOr<EntryStatus> replaced = absl::NotFoundError("");
  absl::Status written = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(ScopedFd out, fs.OpenAt(at, temporary, O_WRONLY | O_CREAT | O_EXCL, 0600));
    const absl::string_view parts[] = {
        absl::string_view(reinterpret_cast<const char*>(&header), sizeof(header)), names,
        absl::string_view(reinterpret_cast<const char*>(chunk), chunk_length)};
    for (absl::string_view part : parts) {
      RETURN_IF_ERROR(fs.BeforeWrite(temporary_path));
      RETURN_IF_ERROR(WriteAll(out.get(), part, temporary_path));
    }
    struct stat status = {};
    if (::fstat(out.get(), &status) != 0) {
      return PosixError(absl::StrCat("stat ", temporary_path), errno);
    }
    inode = status.st_ino;
    // No fsync: a chunk torn by a crash fails its checks and is fetched again.
    RETURN_IF_ERROR(out.Close(temporary_path));
    replaced = fs.StatAt(at, name);
    return fs.RenameAt(at, temporary, name);
  }();
  if (!written.ok()) {
    (void)fs.RemoveAt(at, temporary);
    (void)dir_->AddUsage(-static_cast<int64_t>(bytes));
    TIERD_LOG_EVERY_N_SEC(WARNING, 10) << "remote cache: not keeping a chunk: " << written;
    absl::MutexLock lock(&mu_);
    ++stats_.write_failures;
    return std::nullopt;
  }
  if (replaced.ok()) (void)dir_->AddUsage(-static_cast<int64_t>(replaced->size));
  return inode;
}

bool RemoteCache::Reserve(uint64_t bytes) {
  absl::StatusOr<FileSystemSpace> space = dir_->Space();
  if (space.ok()) {
    const uint64_t reserve = std::min(space->total_bytes / kFreeSpaceShare, kMaxFreeSpaceReserve);
    if (space->free_bytes < SaturatingAdd(bytes, reserve)) {
      TIERD_LOG_EVERY_N_SEC(WARNING, 10)
          << "remote cache " << dir_->path() << ": " << FormatByteSize(space->free_bytes)
          << " free on its file system; not keeping chunks while under " << FormatByteSize(reserve)
          << " would be left";
      return false;
    }
  }
  absl::StatusOr<uint64_t> total = dir_->AddUsage(static_cast<int64_t>(bytes));
  if (!total.ok()) {
    TIERD_LOG_EVERY_N_SEC(WARNING, 10) << "remote cache: " << total.status();
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.cached_bytes = *total;
  }
  // Room for these bytes within 90% of the budget: the write does not take it past.
  if (*total > budget_bytes_)
    EvictDownTo(budget_bytes_ / 10 * 9 - std::min(bytes, budget_bytes_ / 10 * 9));
  return true;
}

void RemoteCache::EvictDownTo(uint64_t bytes) {
  absl::MutexLock one_at_a_time(&evict_mu_);
  // And one daemon at a time.
  absl::StatusOr<ScopedFd> lock = dir_->LockExclusive();
  if (!lock.ok()) {
    TIERD_LOG_EVERY_N_SEC(WARNING, 10) << "remote cache: not evicting: " << lock.status();
    return;
  }
  const CacheSweep swept = dir_->Sweep(bytes);
  absl::MutexLock hold(&mu_);
  stats_.cached_bytes = swept.bytes;
  stats_.chunks_evicted += swept.evicted;
}

RemoteCacheStats RemoteCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tierd
