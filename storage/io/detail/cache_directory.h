// The files of a remote cache's directory (storage/io/remote_cache.h has the layout), reached
// relative to the directory, which is opened once and checked: no symbolic link is followed to it
// or inside it, and it must be this user's and writable by it alone.
//
// Also what the directory's daemons share besides the chunks: the FORMAT (made durably; rebuilt
// when a crash left it empty or cut short), the count of the bytes it holds (DIR/usage, updated
// under a lock on it), and which open caches are alive (DIR/owners/ID, locked by its cache for
// its life: a cache of a process that is gone, whatever its PID namespace, has its unlocked).
//
// Every file and lock goes through a FileSystem (storage/file_system.h), so that tests may fail
// any of them. Private to storage/io/ (the remote cache's). Thread-safe.
#ifndef TIERD_STORAGE_IO_DETAIL_CACHE_DIRECTORY_H_
#define TIERD_STORAGE_IO_DETAIL_CACHE_DIRECTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/fd_io.h"
#include "storage/file_system.h"

namespace tierd {

// Bounds on the chunk size a directory may hold: a FORMAT saying otherwise is refused.
inline constexpr uint64_t kMinCacheChunkBytes = 64 << 10;
inline constexpr uint64_t kMaxCacheChunkBytes = 64 << 20;

// What a sweep of the chunks finds and leaves.
struct CacheSweep {
  uint64_t bytes = 0;    // of the chunks and live pending files left
  uint64_t evicted = 0;  // chunks removed
  uint64_t reaped = 0;   // files of caches that are gone, removed
};

class CacheDirectory {
 public:
  // Opens (making it, mode 0700, when missing) the cache directory at `path` through
  // `file_system`, with its FORMAT: a new one says `chunk_bytes`. See RemoteCache::Open for the
  // errors. REQUIRES: `file_system` is not null.
  static absl::StatusOr<std::unique_ptr<CacheDirectory>> Open(
      const std::string& path, uint64_t chunk_bytes, std::shared_ptr<FileSystem> file_system);
  ~CacheDirectory();
  CacheDirectory(const CacheDirectory&) = delete;
  CacheDirectory& operator=(const CacheDirectory&) = delete;

  const std::string& path() const { return dir_.path; }
  FileSystem& file_system() const { return *file_system_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // This open cache's id: it names the cache's pending and temporary files.
  const std::string& owner() const { return owner_; }

  // The directory of bucket `bucket` (0-255: a chunk's hash's first byte) under chunks/.
  const Directory& bucket(int bucket) const { return buckets_[bucket]; }
  // "chunks/XX/NAME", for messages.
  std::string Describe(int bucket, absl::string_view name) const;

  // DIR/lock, opened anew (a description of its own, for a byte-range lock of its own).
  absl::StatusOr<ScopedFd> OpenLockFile() const;
  // DIR/lock under flock(LOCK_EX), held until the descriptor is closed: one sweep at a time
  // across the directory's daemons (flock locks and the byte-range ones do not meet).
  absl::StatusOr<ScopedFd> LockExclusive() const;

  // Adds `delta` to the bytes the directory holds (DIR/usage); returns the new total. A count that
  // would go below zero stops at zero (a sweep corrects it).
  absl::StatusOr<uint64_t> AddUsage(int64_t delta) const;
  // Free and total bytes of the directory's file system.
  absl::StatusOr<FileSystemSpace> Space() const;

  // Counts the chunks and pending files, removes the pending and temporary files of caches that
  // are gone, removes the least recently used chunks until at most `evict_to` bytes are left, and
  // sets DIR/usage to what is left. REQUIRES: flock of DIR/lock held (one sweep at a time).
  CacheSweep Sweep(uint64_t evict_to) const;

 private:
  CacheDirectory() = default;
  // Reads the FORMAT (its chunk size), or makes it saying `chunk_bytes`: durably when missing,
  // anew (the chunks removed) when a crash left it empty or cut short or it is of version 1.
  absl::Status OpenFormat(uint64_t chunk_bytes);
  // Writes `total` to DIR/usage (`fd`). REQUIRES: its byte lock held.
  absl::Status WriteUsage(int fd, uint64_t total) const;
  // Whether the open cache `owner` is gone (its owner file is not locked, or missing).
  bool OwnerIsGone(absl::string_view owner) const;

  std::shared_ptr<FileSystem> file_system_;
  uint64_t chunk_bytes_ = 0;
  std::string owner_;
  Directory dir_;
  Directory owners_;
  ScopedFd owner_lock_{-1};         // DIR/owners/ID, locked while this lives
  std::vector<Directory> buckets_;  // chunks/00 ... chunks/ff
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_DETAIL_CACHE_DIRECTORY_H_
