// Writes host-cache objects to files under the spill directory, with io_uring, O_DIRECT where the
// filesystem allows it (buffered otherwise), straight from the arena: arena allocations are
// page-aligned and page-sized, which is what O_DIRECT asks for. pwrite where io_uring is
// unavailable. Jobs run one at a time on the writer's thread, each with several writes in flight
// (storage/io/detail/uring.h).
//
// Spill files are a cache, not a store: they are not fsynced and are removed when the daemon
// starts.
//
// Thread-safe.
#ifndef TIERD_STORAGE_IO_SPILL_WRITER_H_
#define TIERD_STORAGE_IO_SPILL_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "common/worker_pool.h"
#include "storage/file_system.h"

namespace tierd {

class Uring;

struct SpillJob {
  std::string path;
  const uint8_t* data = nullptr;  // page-aligned
  uint64_t bytes = 0;             // a multiple of the page size
  // Called once, on the writer's thread: OK, or the error (RESOURCE_EXHAUSTED for a full disk).
  // The file is removed on error.
  absl::AnyInvocable<void(absl::Status) &&> done;
};

struct SpillWriterOptions {
  // Where spill files are created, removed and written (each chunk announced with
  // FileSystem::BeforeWrite). Null: the POSIX file system.
  std::shared_ptr<FileSystem> file_system;
};

class SpillWriter {
 public:
  // Creates `directory` if needed and empties it of earlier spill files.
  static absl::StatusOr<std::unique_ptr<SpillWriter>> Create(
      const std::string& directory, const SpillWriterOptions& options = {});
  // Finishes queued jobs, then joins.
  ~SpillWriter();
  SpillWriter(const SpillWriter&) = delete;
  SpillWriter& operator=(const SpillWriter&) = delete;

  const std::string& directory() const { return directory_; }
  // REQUIRES: data stays valid and unchanged until done.
  void Write(SpillJob job);
  // Deletes a spill file this writer wrote, now that nothing reads it; a failure is logged (the
  // directory is emptied at the next start anyway).
  void Remove(const std::string& path);

 private:
  SpillWriter(std::string directory, std::shared_ptr<FileSystem> file_system);
  // On worker_.
  absl::Status WriteFile(const SpillJob& job);

  const std::string directory_;
  const std::shared_ptr<FileSystem> file_system_;
  std::unique_ptr<Uring> uring_;  // worker_'s thread's alone, made at its first job
  WorkerPool worker_{1};          // last: destroyed (its jobs finished) first
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_SPILL_WRITER_H_
