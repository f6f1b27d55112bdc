// A cache of remote model files on local disk (--remote-cache-dir), under the remote reader: a
// restarted daemon, or another daemon of the node, reads a remote model's bytes from here rather
// than from the object store again.
//
// A remote file is cached in chunks of chunk_bytes at multiples of chunk_bytes, each in a file of
// its own, named by a hash of the file's URL and ETag and the chunk's index:
//
//   DIR/FORMAT                       "tierd remote cache 1 chunk_bytes=N"
//   DIR/lock                         byte-range locks: one download of a chunk at a time
//   DIR/chunks/XX/HASH16-INDEX       a header (URL, ETag, file size, offset, length, checksum)
//                                    and the chunk's bytes
//
// A chunk is used only when its header names the same URL, ETag, file size and range and its
// bytes match the header's checksum (xxHash3): a torn write after a crash, a file changed under
// the cache or a chunk of another version of the object is a miss, fetched again and replaced.
// Chunks are written to a temporary name and renamed into place, so a reader sees a whole chunk
// or none. A daemon that misses takes the chunk's lock (an open-file-description lock on a byte
// of DIR/lock, which threads and processes contend for alike), looks again and fetches only when
// the chunk is still missing: the node's daemons sharing the directory download each chunk once.
//
// The byte budget is the directory's, whoever writes it: a daemon whose writes take the total it
// knows past the budget takes DIR/lock (flock, one evicting daemon at a time), lists every chunk
// and removes the least recently used ones (by modification time, which each hit refreshes) down
// to 90% of it. A chunk removed while another daemon reads it stays readable to that daemon. A
// directory that others than this user can write to is refused: its chunks are served to clients as
// the model's bytes.
//
// Thread-safe.
#ifndef TIERD_STORAGE_REMOTE_CACHE_H_
#define TIERD_STORAGE_REMOTE_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tierd {

struct RemoteCacheOptions {
  std::string directory;  // created (mode 0700) when missing
  // The most the directory's chunks may take; 0: 80% of the space its file system has free when
  // the cache opens, the chunks it holds counted as free.
  uint64_t budget_bytes = 0;
  // Of a new directory; a directory already holding a cache keeps the size it was made with.
  uint64_t chunk_bytes = 8ull << 20;
};

struct RemoteCacheStats {
  uint64_t hit_bytes = 0;      // range bytes served from cached chunks
  uint64_t fetched_bytes = 0;  // chunk bytes fetched from the store on a miss
  uint64_t chunks_written = 0;
  uint64_t chunks_refused = 0;  // found, but failing their checks: fetched again
  uint64_t chunks_evicted = 0;
  uint64_t write_failures = 0;  // chunks fetched but not kept (a full disk, ...)
  uint64_t cached_bytes = 0;    // in the directory, as this daemon last counted
};

// Where a remote file's chunk lies and what it must be.
struct RemoteChunkKey {
  std::string url;   // the file's s3:// URL
  std::string etag;  // as registered
  uint64_t file_size = 0;
};

class RemoteCache {
 public:
  // Fetches `length` bytes of the file at `offset` into `destination`: from the store.
  using Fetch =
      absl::FunctionRef<absl::Status(uint64_t offset, uint64_t length, uint8_t* destination)>;

  // Opens (or makes) the cache in options.directory: removes the temporary files of writers that
  // are gone, counts the chunks and evicts down to the budget. Errors: INVALID_ARGUMENT for an
  // empty directory or a budget under 4 chunks; PERMISSION_DENIED for a directory not owned by this
  // user or writable by its group or others; FAILED_PRECONDITION for a FORMAT this version does not
  // know; I/O errors.
  static absl::StatusOr<std::unique_ptr<RemoteCache>> Open(const RemoteCacheOptions& options);
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;

  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t budget_bytes() const { return budget_bytes_; }

  // Fills `destination` with `length` bytes of `file` from `offset`: from the chunk holding them
  // when it is cached and passes its checks, else by fetching that whole chunk with `fetch` and
  // keeping it (a chunk that cannot be written is still served). Returns the bytes fetched: 0 on
  // a hit. A range other than a whole chunk goes through a chunk-sized buffer the calling thread
  // keeps for its life. Errors: `fetch`'s (nothing is kept then); INVALID_ARGUMENT for a range not
  // inside one chunk of the file. REQUIRES: `destination` holds `length` bytes.
  absl::StatusOr<uint64_t> Read(const RemoteChunkKey& file, uint64_t offset, uint64_t length,
                                uint8_t* destination, Fetch fetch) ABSL_LOCKS_EXCLUDED(mu_);

  RemoteCacheStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RemoteCache(const std::string& directory, uint64_t budget_bytes, uint64_t chunk_bytes);

  // The chunk's file, or a miss (false) when it is absent or fails a check; with `report`, a
  // chunk failing a check is logged and counted as refused.
  bool ReadChunk(const std::string& path, const RemoteChunkKey& file, uint64_t chunk_offset,
                 uint64_t chunk_length, uint8_t* chunk, bool report);
  // Writes a chunk under a temporary name and renames it into place; false when it could not.
  bool WriteChunk(const std::string& path, const RemoteChunkKey& file, uint64_t chunk_offset,
                  const uint8_t* chunk, uint64_t chunk_length);
  // The file of chunk `index` of the file whose key hashes to `key_hash`.
  std::string ChunkPath(uint64_t key_hash, uint64_t index) const;
  // Removes the least recently used chunks until the directory holds 90% of the budget.
  void EvictDownToBudget() ABSL_LOCKS_EXCLUDED(mu_, evict_mu_);

  const std::string directory_;
  const uint64_t budget_bytes_;
  const uint64_t chunk_bytes_;
  const std::string lock_path_;  // DIR/lock: each lock opens it anew, a description of its own

  absl::Mutex evict_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one eviction at a time in this process
  mutable absl::Mutex mu_;
  RemoteCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_STORAGE_REMOTE_CACHE_H_
