// Reads byte ranges of files into memory, in priority order, with io_uring.
//
// Each reader thread owns one ring (fixed queue depth) and a set of page-aligned bounce buffers
// registered with the ring as fixed buffers. Every read is done in chunks of the range's aligned
// superset (offsets and lengths rounded out to 4 KiB), with O_DIRECT. Where the caller's
// destination has room for that superset (ReadTarget::aligned_window) the chunks land there
// directly; otherwise they land in a bounce buffer and the wanted bytes are copied out. The bounce
// copy is what lets any range — unaligned tensors, objects gathered from many places — be read
// with O_DIRECT; it costs a memcpy, which matters only when the disk runs at memory speed (a host
// page cache behind a virtual disk: measured there, the copy cost 45% of a single thread's rate).
//
// Targets of one file close together (within 64 KiB) are read in one chunk. A chunk most of whose
// bytes no target wants — a strided shard's slices, the rest of each row being other ranks' — is
// read through the page cache instead: the node's other ranks read the same blocks at about the
// same time, and the page cache makes that one read of the device rather than one per rank.
//
// Files whose pages are memory (tmpfs, ramfs) are read by the reader thread itself with pread,
// straight into the destination, in pieces of 256 KiB, each told to the request as it lands
// (ReadRequest::landed) so that it is hashed while it is in the thread's cache
// (detail/memory_read.h).
//
// Fallbacks, each logged once: buffered reads for files whose filesystem refuses O_DIRECT
// (overlayfs); pread from the reader threads where io_uring is unavailable (old kernels, seccomp).
//
// Scheduling: demand reads before prefetches, earliest deadline first within a class, then first
// come first served. A request is issued chunk by chunk, so a demand read overtakes a large
// prefetch after at most one chunk per slot. Queued requests can be cancelled or reprioritized.
//
// Thread-safe.
#ifndef TIERD_STORAGE_IO_DISK_READER_H_
#define TIERD_STORAGE_IO_DISK_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/file_system.h"
#include "storage/io/detail/read_queue.h"
#include "storage/model.h"
#include "storage/model_roots.h"
#include "storage/read_request.h"

namespace tierd {

enum class IoEngine { kAuto, kIoUring, kPread };

// "auto" / "io_uring" / "pread" ↔ IoEngine.
std::optional<IoEngine> ParseIoEngine(absl::string_view name);
const char* IoEngineName(IoEngine engine);

struct DiskReaderOptions {
  int threads = 2;
  int queue_depth = 16;               // reads in flight per thread
  uint64_t chunk_bytes = 4ull << 20;  // a multiple of 4 KiB
  IoEngine engine = IoEngine::kAuto;  // kAuto: io_uring, else pread
  bool direct = true;                 // O_DIRECT where the filesystem allows it
  // Where model files are opened: beneath their root, following no symbolic link (see
  // ReadTarget::model_file).
  ModelRoots model_roots;
  // Where files are opened; each chunk is announced to it (FileSystem::BeforeRead) before it is
  // read. Null: the POSIX file system.
  std::shared_ptr<FileSystem> file_system;
};

struct DiskReaderStats {
  uint64_t requests_completed = 0;
  uint64_t requests_failed = 0;
  uint64_t requests_cancelled = 0;
  uint64_t bytes_delivered = 0;  // bytes copied to destinations
  uint64_t bytes_read = 0;       // bytes read from disk, alignment slack included
  // Of bytes_read, those of sparse chunks, read through the page cache: some of them may have come
  // from there rather than from the device (see the header comment).
  uint64_t sparse_bytes_read = 0;
  uint64_t queued_requests = 0;  // requests with chunks still to issue
  uint64_t buffered_files = 0;   // files read without O_DIRECT, memory-backed ones aside
  uint64_t memory_files = 0;     // files read from memory in pieces (tmpfs, ramfs)
  IoEngine engine = IoEngine::kIoUring;
};

class DiskReader final : public Reader {
 public:
  // Errors: INVALID_ARGUMENT for bad options; UNAVAILABLE when engine is kIoUring and io_uring
  // cannot be used.
  static absl::StatusOr<std::unique_ptr<DiskReader>> Create(const DiskReaderOptions& options);
  // Fails queued requests with UNAVAILABLE, lets reads in flight finish, joins the threads.
  ~DiskReader() override;
  DiskReader(const DiskReader&) = delete;
  DiskReader& operator=(const DiskReader&) = delete;

  // Reader's contract. A request's check is not run: the caller checks in its done.
  RequestId Submit(ReadRequest request) override ABSL_LOCKS_EXCLUDED(mu_);
  bool Cancel(RequestId id) override ABSL_LOCKS_EXCLUDED(mu_);
  bool Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the cached descriptors of `path`. REQUIRES: no request reading it is outstanding.
  void ForgetFile(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  DiskReaderStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  struct Request;
  struct Chunk;
  struct File;

 private:
  class Worker;

  explicit DiskReader(const DiskReaderOptions& options);
  // Takes the next chunk to read; with `wait`, sleeps until there is one or the reader stops.
  // Returns false when there is none.
  bool NextChunk(bool wait, Chunk* chunk) ABSL_LOCKS_EXCLUDED(mu_);
  void FinishChunk(const Chunk& chunk, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // The open file `target` reads, opened (and checked, for a model file) on first use.
  absl::StatusOr<File*> OpenFile(const ReadTarget& target) ABSL_LOCKS_EXCLUDED(mu_);
  // One descriptor of `target`'s file with `flags`, checked when it is a model file.
  absl::StatusOr<ScopedFd> OpenDescriptor(const ReadTarget& target, bool direct) const;
  void NoteBytesRead(uint64_t bytes, bool sparse) ABSL_LOCKS_EXCLUDED(mu_);
  void UseBuffered(File* file, int error) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops handing out `file` after a read of it failed; it is closed once no read is in flight.
  void RetireFile(File* file) ABSL_LOCKS_EXCLUDED(mu_);

  const DiskReaderOptions options_;
  const std::shared_ptr<FileSystem> file_system_;

  mutable absl::Mutex mu_;
  RequestId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  ReadQueue queue_ ABSL_GUARDED_BY(mu_);  // live requests with chunks to issue
  std::map<RequestId, Request*> live_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<File>> files_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<File>> retired_files_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  DiskReaderStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_DISK_READER_H_
