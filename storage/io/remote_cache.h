// A cache of remote model files on local disk (--remote-cache-dir), under the remote reader: a
// restarted daemon, or another daemon of the node, reads a remote model's bytes from here rather
// than from the object store again.
//
// A remote file is cached in chunks of chunk_bytes at multiples of chunk_bytes, each in a file of
// its own, named by a hash of the store's endpoint, the file's URL and ETag and the chunk's index:
//
//   DIR/FORMAT                       "tierd remote cache 2 chunk_bytes=N", written durably
//   DIR/lock                         byte-range locks: one download of a chunk at a time
//   DIR/usage                        the bytes the directory's chunks take, across its daemons
//   DIR/owners/ID                    one per open cache, locked while it lives
//   DIR/chunks/XX/HASH16-INDEX       a header (endpoint, URL, ETag, file size, offset, length,
//                                    checksum) and the chunk's bytes
//   DIR/chunks/XX/HASH16-INDEX.pending  the same, fetched and not yet checked
//
// Nothing enters the cache unverified. A chunk fetched on a miss is written aside (its pending
// file, through a temporary one) and served from memory; it is kept — renamed into place — only
// once a read it served has checked its bytes (Keep), and dropped otherwise (Discard). A reader
// that misses while a chunk is pending is served the pending one, and its own check decides too.
// A chunk found in place whose bytes then fail a read's check is removed. Pending files no read
// has settled for 10 minutes (their daemon died) are removed by a sweep. A chunk is used only when
// its header names the same endpoint, URL, ETag, file size and range and its bytes match the
// header's checksum (xxHash3): a torn write after a crash, a file changed under the cache or a
// chunk of another version of the object is a miss, fetched again and replaced. A daemon that
// misses takes the chunk's lock (an open-file-description lock on a byte of DIR/lock, waited for at
// most until the read's deadline), looks again and fetches only when the chunk is still missing.
//
// The directory is opened once (no symbolic link followed) and every file in it is reached
// relative to it (openat, O_NOFOLLOW). A temporary file belongs to the open cache named in it; the
// cache of a process that is gone (its owner file no longer locked, whatever PID namespace it ran
// in) has its temporary files removed by the next sweep.
//
// The byte budget is the directory's, whoever writes it: DIR/usage counts every chunk and pending
// file of every daemon sharing it, and a write that would take it past the budget first evicts
// (one daemon at a time, under flock of DIR/lock) the least recently used chunks (by modification
// time, which each hit refreshes) until it fits within 90% of it. A write also leaves the file
// system at least 5% (at most 1 GiB) free, or is not kept. A chunk removed while another daemon
// reads it stays readable to that daemon. A directory that others than this user can write to is
// refused: its chunks are served to clients as the model's bytes.
//
// Thread-safe.
#ifndef TIERD_STORAGE_IO_REMOTE_CACHE_H_
#define TIERD_STORAGE_IO_REMOTE_CACHE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/fd_io.h"
#include "storage/file_system.h"

namespace tierd {

class CacheDirectory;  // storage/io/detail/cache_directory.h

struct RemoteCacheOptions {
  std::string directory;  // created (mode 0700) when missing
  // The most the directory's chunks may take; 0: 80% of the space its file system has free when
  // the cache opens, the chunks it holds counted as free.
  uint64_t budget_bytes = 0;
  // Of a new directory; a directory already holding a cache keeps the size it was made with.
  // Between 64 KiB and 64 MiB, a multiple of 4 KiB.
  uint64_t chunk_bytes = 8ull << 20;
  // Every file and lock of the directory goes through it; null: the POSIX file system.
  std::shared_ptr<FileSystem> file_system;
};

struct RemoteCacheStats {
  uint64_t hit_bytes = 0;         // range bytes served from cached chunks
  uint64_t fetched_bytes = 0;     // chunk bytes fetched from the store on a miss
  uint64_t chunks_written = 0;    // kept, their reads' checks passed
  uint64_t chunks_refused = 0;    // found, but failing their checks: fetched again
  uint64_t chunks_discarded = 0;  // fetched, but their reads failed a check: never kept
  uint64_t chunks_removed = 0;    // kept, then found to fail a read's check
  uint64_t chunks_evicted = 0;
  uint64_t write_failures = 0;  // chunks fetched but not kept (a full disk, ...)
  uint64_t cached_bytes = 0;    // in the directory, as DIR/usage last said
};

// Where a remote file's chunk lies and what it must be.
struct RemoteChunkKey {
  std::string endpoint;  // the store's URL: one bucket and key at two endpoints are two files
  std::string url;       // the file's s3:// URL
  std::string etag;      // as registered
  uint64_t file_size = 0;
};

// A range of one chunk of a file and where its bytes go.
struct RemoteCachePiece {
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;
  uint8_t* destination = nullptr;
};

// A chunk a read used: one it found in place (removed if the read's check fails), or a pending
// one — fetched and written aside by this read or another — kept only if the check passes.
struct RemoteChunkUse {
  uint64_t key_hash = 0;
  uint64_t index = 0;
  bool pending = false;
  uint64_t pending_inode = 0;  // the pending file the bytes came from: only it is kept
};

class RemoteCache {
 public:
  // Fetches `length` bytes of the file at `offset` into `destination`: from the store.
  using Fetch =
      absl::FunctionRef<absl::Status(uint64_t offset, uint64_t length, uint8_t* destination)>;

  // Opens (or makes) the cache in options.directory: removes the files of caches that are gone,
  // counts the chunks and evicts down to the budget. A FORMAT left empty or cut short by a crash
  // is rebuilt (its chunks removed); one of version 1 too. Errors: INVALID_ARGUMENT for an empty
  // directory, a chunk size out of bounds or a budget under 4 chunks; PERMISSION_DENIED for a
  // directory not owned by this user or writable by its group or others, or a symbolic link;
  // FAILED_PRECONDITION for a FORMAT this version does not know, or a chunk size in it out of
  // bounds; I/O errors.
  static absl::StatusOr<std::unique_ptr<RemoteCache>> Open(const RemoteCacheOptions& options);
  ~RemoteCache();
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;

  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t budget_bytes() const { return budget_bytes_; }

  // Fills every piece (each inside chunk `index` of `file`) from that chunk: from its file (in
  // place or pending) when it is cached and passes its checks, else by fetching the whole chunk
  // with `fetch` and writing it aside (a chunk that cannot be written is still served). `use`
  // says which it was: the caller Keeps or Discards it once it has checked the bytes served.
  // Returns the bytes fetched: 0 on a
  // hit. Pieces other than one whole chunk go through a chunk-sized buffer the calling thread
  // keeps for its life. Waits for another reader fetching the chunk at most until `deadline`
  // (then fetches past the cache) and not after `stopped` says so (CANCELLED). Errors: `fetch`'s
  // (nothing is kept then); INVALID_ARGUMENT for a piece not inside the chunk. REQUIRES: each
  // destination holds its piece's length.
  absl::StatusOr<uint64_t> Read(const RemoteChunkKey& file, uint64_t index,
                                absl::Span<const RemoteCachePiece> pieces, Fetch fetch,
                                RemoteChunkUse* use, absl::Time deadline,
                                absl::FunctionRef<bool()> stopped) ABSL_LOCKS_EXCLUDED(mu_);

  // The read `use` served checked its bytes: a pending chunk it used is renamed into place
  // (unless another read replaced or settled it meanwhile).
  void Keep(const RemoteChunkUse& use) ABSL_LOCKS_EXCLUDED(mu_);
  // The read `use` served failed, before or while checking its bytes: a pending chunk it used is
  // dropped; with `bad` (its bytes failed the check), the chunk in place is removed too.
  void Discard(const RemoteChunkUse& use, bool bad) ABSL_LOCKS_EXCLUDED(mu_);

  RemoteCacheStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RemoteCache(std::unique_ptr<CacheDirectory> directory, uint64_t budget_bytes);

  // Reads the chunk file `name` into `chunk`: its inode, or nullopt (a miss) when it is absent
  // or fails a check; with `report`, a chunk failing a check is logged and counted as refused.
  std::optional<uint64_t> ReadChunk(const std::string& name, int bucket, const RemoteChunkKey& file,
                                    uint64_t chunk_offset, uint64_t chunk_length, uint8_t* chunk,
                                    bool report) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes a chunk to its pending name (through a temporary one): its inode, or nullopt when it
  // could not be written.
  std::optional<uint64_t> WritePending(const std::string& name, int bucket,
                                       const RemoteChunkKey& file, uint64_t chunk_offset,
                                       const uint8_t* chunk, uint64_t chunk_length)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes `name` from `bucket` when it is (still) the file `inode` (any, for 0), counting its
  // bytes out of the directory's; true when it did.
  bool RemoveFile(int bucket, const std::string& name, uint64_t inode) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `bytes` more of the budget for a file about to be written: evicts first when the
  // directory would pass it. False when the file system has too little free space for them.
  bool Reserve(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_, evict_mu_);
  // Removes the least recently used chunks until the directory holds at most `bytes`.
  void EvictDownTo(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_, evict_mu_);

  const std::unique_ptr<CacheDirectory> dir_;
  const uint64_t budget_bytes_;
  const uint64_t chunk_bytes_;

  absl::Mutex evict_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one eviction at a time in this process
  mutable absl::Mutex mu_;
  RemoteCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_REMOTE_CACHE_H_
