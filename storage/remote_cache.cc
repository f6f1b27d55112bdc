#include "storage/remote_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/fd_io.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "common/status_macros.h"

namespace tierd {
namespace {

constexpr char kFormatLine[] = "tierd remote cache 1 chunk_bytes=";
constexpr char kMagic[8] = {'T', 'R', 'C', 'H', 'U', 'N', 'K', '1'};
constexpr char kTemporaryMarker[] = ".tmp-";
// Byte-range locks on DIR/lock: one byte per chunk, chunks sharing a byte now and then.
constexpr uint64_t kLockSlots = 1 << 20;

// The fixed part of a chunk file's header; the URL and the ETag follow it, then the bytes.
struct ChunkHeader {
  char magic[8];
  uint64_t file_size;
  uint64_t chunk_offset;
  uint64_t chunk_length;
  uint64_t checksum;  // XXH3 of the chunk's bytes
  uint32_t url_length;
  uint32_t etag_length;
};
static_assert(sizeof(ChunkHeader) == 48);

uint64_t KeyHash(const RemoteChunkKey& file) {
  const std::string key = absl::StrCat(file.url, "\n", file.etag, "\n", file.file_size);
  return XXH3_64bits(key.data(), key.size());
}

// An open-file-description lock on byte `slot` of DIR/lock, held while this lives: threads and
// processes contend for it alike, as each lock opens the file anew.
class SlotLock {
 public:
  static absl::StatusOr<SlotLock> Take(const std::string& path, off_t slot) {
    ScopedFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path), errno);
    struct flock lock = {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    lock.l_start = slot;
    lock.l_len = 1;
    while (::fcntl(fd.get(), F_OFD_SETLKW, &lock) != 0) {
      if (errno != EINTR) return PosixError(absl::StrCat("locking ", path), errno);
    }
    return SlotLock(std::move(fd));
  }

 private:
  explicit SlotLock(ScopedFd fd) : fd_(std::move(fd)) {}
  ScopedFd fd_;  // closing it releases the lock
};

// The pid a temporary file's name carries ("NAME.tmp-PID-N"), or 0.
pid_t WriterOf(absl::string_view name) {
  const size_t at = name.find(kTemporaryMarker);
  if (at == absl::string_view::npos) return 0;
  absl::string_view rest = name.substr(at + std::strlen(kTemporaryMarker));
  pid_t pid = 0;
  return absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid) ? pid : 0;
}

bool ProcessIsGone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

absl::StatusOr<uint64_t> ChunkBytesOf(const std::string& directory, uint64_t wanted) {
  const std::string path = absl::StrCat(directory, "/FORMAT");
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT) {
    // A new cache: written once, renamed into place (a racing daemon's FORMAT wins if it is first).
    const std::string temporary = absl::StrCat(path, kTemporaryMarker, ::getpid());
    ScopedFd out(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (out.get() < 0) return PosixError(absl::StrCat("creating ", temporary), errno);
    RETURN_IF_ERROR(WriteAll(out.get(), absl::StrCat(kFormatLine, wanted, "\n"), temporary));
    RETURN_IF_ERROR(out.Close(temporary));
    if (::link(temporary.c_str(), path.c_str()) != 0 && errno != EEXIST) {
      const int error = errno;
      ::unlink(temporary.c_str());
      return PosixError(absl::StrCat("creating ", path), error);
    }
    ::unlink(temporary.c_str());
    fd = ScopedFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  }
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path), errno);
  char text[128] = {};
  absl::StatusOr<size_t> got = ReadUpTo(fd.get(), text, sizeof(text) - 1, path);
  if (!got.ok()) return got.status();
  absl::string_view line = absl::StripTrailingAsciiWhitespace(absl::string_view(text, *got));
  uint64_t chunk_bytes = 0;
  if (!absl::ConsumePrefix(&line, kFormatLine) || !absl::SimpleAtoi(line, &chunk_bytes) ||
      chunk_bytes == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        " is not a remote cache this version of tierd knows; give --remote-cache-dir an "
        "empty directory, or remove this one"));
  }
  return chunk_bytes;
}

// What a sweep of a cache directory leaves.
struct SweepResult {
  uint64_t left = 0;     // bytes of the chunks left
  uint64_t evicted = 0;  // chunks removed
};

// Counts the chunks under `directory` (and removes the temporary files of writers that died);
// removes the least recently used until at most `evict_to` bytes are left.
SweepResult SweepChunks(const std::string& directory, uint64_t evict_to) {
  struct Chunk {
    struct timespec used;
    uint64_t bytes;
    std::string path;
  };
  std::vector<Chunk> chunks;
  uint64_t total = 0;
  const std::string root = absl::StrCat(directory, "/chunks");
  DIR* top = ::opendir(root.c_str());
  if (top == nullptr) return {};
  while (const dirent* bucket = ::readdir(top)) {
    if (bucket->d_name[0] == '.') continue;
    const std::string bucket_path = absl::StrCat(root, "/", bucket->d_name);
    DIR* inner = ::opendir(bucket_path.c_str());
    if (inner == nullptr) continue;
    while (const dirent* entry = ::readdir(inner)) {
      if (entry->d_name[0] == '.') continue;
      std::string path = absl::StrCat(bucket_path, "/", entry->d_name);
      const pid_t writer = WriterOf(entry->d_name);
      if (writer != 0) {
        if (ProcessIsGone(writer)) ::unlink(path.c_str());  // a writer that died mid-chunk
        continue;
      }
      struct stat status = {};
      if (::stat(path.c_str(), &status) != 0 || !S_ISREG(status.st_mode)) continue;
      total += status.st_size;
      chunks.push_back({status.st_mtim, static_cast<uint64_t>(status.st_size), std::move(path)});
    }
    ::closedir(inner);
  }
  ::closedir(top);
  if (total <= evict_to) return {total, 0};
  std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) {
    return std::tie(a.used.tv_sec, a.used.tv_nsec) < std::tie(b.used.tv_sec, b.used.tv_nsec);
  });
  uint64_t evicted = 0;
  for (const Chunk& chunk : chunks) {
    if (total <= evict_to) break;
    if (::unlink(chunk.path.c_str()) == 0) {
      total -= chunk.bytes;
      ++evicted;
    }
  }
  return {total, evicted};
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteCache>> RemoteCache::Open(const RemoteCacheOptions& options) {
  if (options.directory.empty() || options.chunk_bytes == 0) {
    return absl::InvalidArgumentError("a remote cache needs a directory and a chunk size");
  }
  const std::string& directory = options.directory;
  if (::mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
    return PosixError(absl::StrCat("creating the remote cache ", directory), errno);
  }
  struct stat status = {};
  if (::stat(directory.c_str(), &status) != 0) {
    return PosixError(absl::StrCat("the remote cache ", directory), errno);
  }
  if (!S_ISDIR(status.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the remote cache ", directory, " is not a directory"));
  }
  // Whoever can write here decides what clients are served as a remote model's bytes.
  if (status.st_uid != ::geteuid() || (status.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "the remote cache %s must belong to this user (uid %d) and be writable by it only "
        "(chmod 700)",
        directory, ::geteuid()));
  }
  absl::StatusOr<uint64_t> chunk_bytes = ChunkBytesOf(directory, options.chunk_bytes);
  if (!chunk_bytes.ok()) return chunk_bytes.status();
  const std::string chunks = absl::StrCat(directory, "/chunks");
  if (::mkdir(chunks.c_str(), 0700) != 0 && errno != EEXIST) {
    return PosixError(absl::StrCat("creating ", chunks), errno);
  }
  const std::string lock_path = absl::StrCat(directory, "/lock");
  ScopedFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (lock.get() < 0) return PosixError(absl::StrCat("creating ", lock_path), errno);
  // Counted before the budget is known: a budget of 0 counts what the chunks take as free.
  const uint64_t cached = SweepChunks(directory, UINT64_MAX).left;
  uint64_t budget = options.budget_bytes;
  if (budget == 0) {
    struct statvfs space = {};
    if (::statvfs(directory.c_str(), &space) != 0) {
      return PosixError(absl::StrCat("the free space of ", directory), errno);
    }
    budget = (static_cast<uint64_t>(space.f_bavail) * space.f_frsize + cached) / 10 * 8;
  }
  if (budget < 4 * *chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the remote cache's budget in ", directory, " (", budget,
                     " bytes) must hold at least 4 chunks of ", *chunk_bytes, " bytes"));
  }
  std::unique_ptr<RemoteCache> cache(new RemoteCache(directory, budget, *chunk_bytes));
  {
    absl::MutexLock hold(&cache->mu_);
    cache->stats_.cached_bytes = cached;
  }
  if (cached > budget) cache->EvictDownToBudget();
  TIERD_LOG(INFO) << "remote cache " << directory << ": " << FormatByteSize(cached)
                  << " cached, budget " << FormatByteSize(budget) << ", chunks of "
                  << FormatByteSize(*chunk_bytes);
  return cache;
}

RemoteCache::RemoteCache(const std::string& directory, uint64_t budget_bytes, uint64_t chunk_bytes)
    : directory_(directory),
      budget_bytes_(budget_bytes),
      chunk_bytes_(chunk_bytes),
      lock_path_(absl::StrCat(directory, "/lock")) {}

std::string RemoteCache::ChunkPath(uint64_t key_hash, uint64_t index) const {
  const std::string hash = absl::StrFormat("%016x", key_hash);
  return absl::StrCat(directory_, "/chunks/", hash.substr(0, 2), "/", hash, "-", index);
}

absl::StatusOr<uint64_t> RemoteCache::Read(const RemoteChunkKey& file, uint64_t offset,
                                           uint64_t length, uint8_t* destination, Fetch fetch) {
  const uint64_t index = offset / chunk_bytes_;
  const uint64_t chunk_offset = index * chunk_bytes_;
  const uint64_t chunk_length =
      std::min(chunk_bytes_, file.file_size - std::min(file.file_size, chunk_offset));
  if (length == 0 || offset + length > chunk_offset + chunk_length) {
    return absl::InvalidArgumentError(absl::StrCat("bytes ", offset, "+", length, " of ", file.url,
                                                   " are not inside one cache chunk of it"));
  }
  const uint64_t key_hash = KeyHash(file);
  const std::string path = ChunkPath(key_hash, index);
  // A range that is the whole chunk is read straight into its destination; any other goes
  // through a buffer of this thread's, kept for its next read.
  uint8_t* chunk = destination;
  if (offset != chunk_offset || length != chunk_length) {
    thread_local std::vector<uint8_t> buffer;
    if (buffer.size() < chunk_length) buffer.resize(chunk_length);
    chunk = buffer.data();
  }
  const auto copy_out = [&] {
    if (chunk != destination) std::memcpy(destination, chunk + (offset - chunk_offset), length);
  };
  const auto serve = [&] {
    copy_out();
    absl::MutexLock lock(&mu_);
    stats_.hit_bytes += length;
    return uint64_t{0};
  };
  if (ReadChunk(path, file, chunk_offset, chunk_length, chunk, /*report=*/false)) {
    return serve();
  }

  // A miss: one fetch of this chunk at a time, across this node's daemons.
  bool over_budget = false;
  {
    absl::StatusOr<SlotLock> lock =
        SlotLock::Take(lock_path_, static_cast<off_t>((key_hash ^ index) % kLockSlots));
    if (!lock.ok()) {  // the cache's trouble, not the read's: fetch the range alone
      TIERD_LOG(WARNING) << "remote cache: fetching past it: " << lock.status();
      RETURN_IF_ERROR(fetch(offset, length, destination));
      absl::MutexLock hold(&mu_);
      stats_.fetched_bytes += length;
      return length;
    }
    if (ReadChunk(path, file, chunk_offset, chunk_length, chunk, /*report=*/true)) {
      return serve();
    }
    RETURN_IF_ERROR(fetch(chunk_offset, chunk_length, chunk));
    copy_out();
    const bool kept = WriteChunk(path, file, chunk_offset, chunk, chunk_length);
    absl::MutexLock hold(&mu_);
    stats_.fetched_bytes += chunk_length;
    if (kept) {
      ++stats_.chunks_written;
      stats_.cached_bytes +=
          sizeof(ChunkHeader) + file.url.size() + file.etag.size() + chunk_length;
      over_budget = stats_.cached_bytes > budget_bytes_;
    } else {
      ++stats_.write_failures;
    }
  }
  if (over_budget) EvictDownToBudget();
  return chunk_length;
}

bool RemoteCache::ReadChunk(const std::string& path, const RemoteChunkKey& file,
                            uint64_t chunk_offset, uint64_t chunk_length, uint8_t* chunk,
                            bool report) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return false;  // not cached
  const auto refuse = [&](absl::string_view why) {
    if (!report) return false;
    TIERD_LOG(WARNING) << "remote cache: " << path << " " << why << "; fetching it again";
    absl::MutexLock lock(&mu_);
    ++stats_.chunks_refused;
    return false;
  };
  ChunkHeader header;
  absl::StatusOr<size_t> got = ReadUpTo(fd.get(), &header, sizeof(header), path);
  if (!got.ok() || *got != sizeof(header) || std::memcmp(header.magic, kMagic, 8) != 0 ||
      header.url_length != file.url.size() || header.etag_length != file.etag.size()) {
    return refuse("has no header of a chunk of this file");
  }
  std::string names(header.url_length + header.etag_length, '\0');
  got = ReadUpTo(fd.get(), names.data(), names.size(), path);
  if (!got.ok() || *got != names.size() || names != absl::StrCat(file.url, file.etag) ||
      header.file_size != file.file_size || header.chunk_offset != chunk_offset ||
      header.chunk_length != chunk_length) {
    return refuse("is a chunk of another file, version or range");
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
  return true;
}

bool RemoteCache::WriteChunk(const std::string& path, const RemoteChunkKey& file,
                             uint64_t chunk_offset, const uint8_t* chunk, uint64_t chunk_length) {
  static std::atomic<uint64_t> next_temporary{0};
  const std::string parent = path.substr(0, path.rfind('/'));
  if (::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST) {
    TIERD_LOG(WARNING) << "remote cache: " << PosixError(absl::StrCat("creating ", parent), errno);
    return false;
  }
  const std::string temporary =
      absl::StrCat(path, kTemporaryMarker, ::getpid(), "-", next_temporary.fetch_add(1));
  ChunkHeader header = {};
  std::memcpy(header.magic, kMagic, 8);
  header.file_size = file.file_size;
  header.chunk_offset = chunk_offset;
  header.chunk_length = chunk_length;
  header.checksum = XXH3_64bits(chunk, chunk_length);
  header.url_length = static_cast<uint32_t>(file.url.size());
  header.etag_length = static_cast<uint32_t>(file.etag.size());
  absl::Status written = [&]() -> absl::Status {
    ScopedFd out(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (out.get() < 0) return PosixError(absl::StrCat("creating ", temporary), errno);
    RETURN_IF_ERROR(WriteAll(
        out.get(), absl::string_view(reinterpret_cast<const char*>(&header), sizeof(header)),
        temporary));
    RETURN_IF_ERROR(WriteAll(out.get(), absl::StrCat(file.url, file.etag), temporary));
    RETURN_IF_ERROR(WriteAll(out.get(),
                             absl::string_view(reinterpret_cast<const char*>(chunk), chunk_length),
                             temporary));
    // No fsync: a chunk torn by a crash fails its checks and is fetched again.
    RETURN_IF_ERROR(out.Close(temporary));
    if (::rename(temporary.c_str(), path.c_str()) != 0) {
      return PosixError(absl::StrCat("renaming ", temporary), errno);
    }
    return absl::OkStatus();
  }();
  if (!written.ok()) {
    ::unlink(temporary.c_str());
    TIERD_LOG(WARNING) << "remote cache: not keeping a chunk: " << written;
    return false;
  }
  return true;
}

void RemoteCache::EvictDownToBudget() {
  absl::MutexLock one_at_a_time(&evict_mu_);
  // And one daemon at a time (flock(2) locks are apart from the slots' fcntl(2) locks).
  ScopedFd fd(::open(lock_path_.c_str(), O_RDWR | O_CLOEXEC));
  while (fd.get() >= 0 && ::flock(fd.get(), LOCK_EX) != 0 && errno == EINTR) {
  }
  if (fd.get() < 0) {
    TIERD_LOG(WARNING) << "remote cache: not evicting: "
                       << PosixError(absl::StrCat("opening ", lock_path_), errno);
    return;
  }
  const SweepResult swept = SweepChunks(directory_, budget_bytes_ / 10 * 9);
  absl::MutexLock hold(&mu_);
  stats_.cached_bytes = swept.left;
  stats_.chunks_evicted += swept.evicted;
}

RemoteCacheStats RemoteCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tierd
