// Reads byte ranges of remote model files (s3:// paths) into memory, as DiskReader reads local
// ones: the same ReadRequest, priorities and deadlines, answered once per request.
//
// A request's targets are gathered per file and cut into parts: ranges of a file close together
// (within 256 KiB) are read by one GET of at most part_bytes, and a longer range is cut in parts of
// part_bytes. `streams` threads each run one part at a time (S3Client::ReadRange: retried,
// resumed, checked against the file's recorded ETag, bounded by the client's call_timeout), so a
// request's parts cross the network in parallel and a demand read waits for at most one part per
// stream before its own parts go. A request fails with its first part's error; its parts not yet
// started are dropped. A slow or failing endpoint holds only these threads: local reads go on.
//
// With a RemoteCache, parts are the cache's chunks instead, each read once through the cache for
// every range of the request inside it: served from local disk when the chunk is there, else
// fetched whole and written aside. The request's check (ReadRequest::check) runs once its parts
// are in: the chunks it fetched are kept only when the check passes, and those it was served are
// removed when the check fails DATA_LOSS — nothing enters the cache unverified.
//
// Thread-safe.
#ifndef TIERD_STORAGE_IO_REMOTE_READER_H_
#define TIERD_STORAGE_IO_REMOTE_READER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/file_semaphore.h"
#include "remote/object_store.h"
#include "storage/io/detail/read_queue.h"
#include "storage/io/remote_cache.h"
#include "storage/read_request.h"

namespace tierd {

struct RemoteReaderOptions {
  int streams = 16;                  // ranged GETs in flight at once
  uint64_t part_bytes = 8ull << 20;  // the most one GET asks for
  // With host_streams > 0: the most GETs in flight at once across every reader (of every
  // process of this user) that names the same file (common/file_semaphore.h): a node's daemons
  // share one bound.
  std::string host_streams_file;
  int host_streams = 0;
};

struct RemoteReaderStats {
  uint64_t requests_completed = 0;
  uint64_t requests_failed = 0;
  uint64_t requests_cancelled = 0;
  uint64_t parts = 0;             // GETs, or chunks read through the cache, started
  uint64_t bytes_read = 0;        // delivered to destinations
  uint64_t bytes_fetched = 0;     // from the store (whole chunks, with a cache)
  uint64_t bytes_from_cache = 0;  // delivered from the cache
  uint64_t parts_in_flight = 0;
  uint64_t queued_requests = 0;
};

class RemoteReader final : public Reader {
 public:
  // `client` (the store) and `cache` (which may be null) must outlive the reader. INVALID_ARGUMENT
  // for streams < 1 or part_bytes 0; FileSemaphore::Open's errors for host_streams_file;
  // RESOURCE_EXHAUSTED when its threads cannot start.
  static absl::StatusOr<std::unique_ptr<RemoteReader>> Create(ObjectStore& client,
                                                              const RemoteReaderOptions& options,
                                                              RemoteCache* cache = nullptr);
  // Stop, then joins the threads.
  ~RemoteReader() override;
  RemoteReader(const RemoteReader&) = delete;
  RemoteReader& operator=(const RemoteReader&) = delete;

  // Reader's contract. Each target is of a registered file of the store (its model_file's
  // object), read against that file's recorded ETag (a changed object fails
  // FAILED_PRECONDITION), through the cache when there is one; the request's check runs before
  // its done. Errors, in `done`: INVALID_ARGUMENT for a target of no such file, the check's, and
  // ObjectStore::ReadRange's. Cancel succeeds while none of the request's parts has started;
  // Reprioritize moves a request that still has parts to start.
  RequestId Submit(ReadRequest request) override ABSL_LOCKS_EXCLUDED(mu_);
  bool Cancel(RequestId id) override ABSL_LOCKS_EXCLUDED(mu_);
  bool Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every read at once (a daemon stopping): queued requests fail UNAVAILABLE now, the GETs in
  // flight end CANCELLED (ObjectStore::Cancel: the store is done with), later requests fail at
  // once. Returns without waiting for the threads. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  RemoteReaderStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A file a request reads, as registered.
  struct File {
    S3Url url;
    std::string etag;
    uint64_t size = 0;
  };
  // Bytes [offset, offset + length) of a file go to destination.
  struct Piece {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint8_t* destination = nullptr;
  };
  // One GET (or one chunk through the cache): the file's bytes [offset, offset + length), which
  // hold every piece.
  struct Part {
    const File* file = nullptr;
    uint64_t offset = 0;
    uint64_t length = 0;
    std::vector<Piece> pieces;
  };
  struct Request {
    RequestId id = 0;
    std::deque<std::unique_ptr<File>> files;  // stable: parts point at them
    std::deque<Part> parts;                   // not started
    int in_flight = 0;
    bool started = false;
    absl::Status status;                 // the first error
    std::vector<RemoteChunkUse> chunks;  // the cache's chunks its parts used
    absl::AnyInvocable<void(absl::Status) &&> done;
    absl::AnyInvocable<absl::Status()> check;
  };

  RemoteReader(ObjectStore& client, const RemoteReaderOptions& options, RemoteCache* cache);
  // Cuts `request`'s targets into parts; INVALID_ARGUMENT for a path that is no s3:// URL.
  absl::Status Plan(const std::vector<ReadTarget>& targets, Request& request) const;
  // Reads a part, through the cache when there is one (recording the chunk it used in `use`);
  // returns the bytes fetched from the store.
  absl::StatusOr<uint64_t> ReadPart(const Part& part, RemoteChunkUse* use);
  // One ranged GET of `file`, holding a host stream (when bounded) while it runs.
  absl::Status Fetch(const File& file, uint64_t offset, uint64_t length, uint8_t* destination);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends `request`, out of requests_, when nothing of it is in flight or queued: runs its check
  // and settles its chunks (the lock dropped meanwhile), and returns its done and status to call
  // outside the lock; null when the request is not over.
  absl::AnyInvocable<void(absl::Status) &&> FinishIfDoneLocked(RequestId id, absl::Status* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ObjectStore& client_;
  RemoteCache* const cache_;
  std::unique_ptr<FileSemaphore> host_streams_;  // null: no bound beyond this reader's
  const RemoteReaderOptions options_;
  std::atomic<bool> stopped_{false};  // Stop ran: waits for locks give up
  mutable absl::Mutex mu_;
  std::map<RequestId, Request> requests_ ABSL_GUARDED_BY(mu_);
  ReadQueue ready_ ABSL_GUARDED_BY(mu_);  // requests with parts to start
  RequestId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  RemoteReaderStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_REMOTE_READER_H_
