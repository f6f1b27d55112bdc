// Stored objects that survive a restart of the daemon: each committed version of a durable object
// is one file under the durable directory (<state dir>/durable), written and fsynced, with a
// checksum, before its commit is acknowledged.
//
// A file is a header page or more, then the object's bytes from a page boundary (so they can be
// read back with O_DIRECT):
//   "TIERDDO1"                 8 bytes, the format
//   metadata length            4 bytes, little-endian
//   reserved                   4 bytes, zero
//   metadata checksum          8 bytes, xxHash3-64 of the metadata, little-endian
//   metadata                   JSON: key, size, checksum of the bytes (ObjectChecksum, hex),
//                              checksum_segment_bytes (absent from records written when the
//                              checksum was xxHash3-64 of the whole object), generation, tensors
//   zeros up to the payload offset (the next multiple of 4 KiB)
// A version is written to "<name>.tmp", fsynced, renamed to "<name>.tdo" and the directory fsynced;
// only then is the previous version of the key removed. Names are the key's 128-bit hash and the
// version's generation (a counter over the whole store), so a crash at any point leaves either
// the old version, or both — and Open keeps the newer. Removing a key unlinks its file and fsyncs
// the directory before it answers, so a deleted or replaced object never comes back.
//
// Jobs (Persist, Remove) run one at a time, in the order they were asked for, on the store's
// thread. Thread-safe.
#ifndef TIERD_STORAGE_HOST_DURABLE_STORE_H_
#define TIERD_STORAGE_HOST_DURABLE_STORE_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/figures.h"
#include "common/worker_pool.h"
#include "storage/file_system.h"
#include "storage/model.h"

namespace tierd {

// One version of a durable object on disk.
struct DurableRecord {
  std::string key;
  uint64_t size = 0;
  std::vector<TensorPlacement> tensors;
  std::string path;
  uint64_t payload_offset = 0;  // where the object's bytes start in the file (page-aligned)
  uint64_t checksum = 0;        // ObjectChecksum of the object's bytes
  // Written before checksums were made of segments: `checksum` is WholeObjectChecksum's.
  bool whole_object_checksum = false;
  uint64_t generation = 0;
};

struct DurableStoreOptions {
  // Where versions are written, synced, renamed and removed. Null: the POSIX file system.
  std::shared_ptr<FileSystem> file_system;
};

struct DurableStoreStats {
  uint64_t objects = 0;  // keys with a version on disk
  uint64_t bytes = 0;    // their sizes
  uint64_t persist_failures = 0;
};

// How each figure is reported (common/figures.h).
inline constexpr Figure<DurableStoreStats> kDurableStoreFigures[] = {
    {"durable_objects", &DurableStoreStats::objects},
    {"durable_bytes", &DurableStoreStats::bytes},
    {"durable_write_failures", &DurableStoreStats::persist_failures},
};
static_assert(std::size(kDurableStoreFigures) * sizeof(uint64_t) == sizeof(DurableStoreStats),
              "every member of DurableStoreStats has its line in kDurableStoreFigures");

class DurableStore {
 public:
  using PersistCallback = absl::AnyInvocable<void(absl::StatusOr<DurableRecord>) &&>;
  using RemoveCallback = absl::AnyInvocable<void(absl::Status) &&>;

  // Opens `directory` (created when missing) and recovers what it holds: the newest complete
  // version of each key, in key order, in `recovered`. Temporary files and older versions are
  // removed; a file whose header is damaged is renamed to "*.damaged" and logged, not loaded.
  // The objects' bytes are not read here: their checksum is checked when they are read back.
  static absl::StatusOr<std::unique_ptr<DurableStore>> Open(const std::string& directory,
                                                            const DurableStoreOptions& options,
                                                            std::vector<DurableRecord>* recovered);
  // Finishes the queued jobs, then joins.
  ~DurableStore();
  DurableStore(const DurableStore&) = delete;
  DurableStore& operator=(const DurableStore&) = delete;

  const std::string& directory() const { return directory_; }

  // Writes a new version of `key` and calls `done` on the store's thread with its record once it
  // is durable (the previous version, if any, removed), or with the error: RESOURCE_EXHAUSTED for
  // a full disk, the write's error otherwise; the previous version then stays.
  // REQUIRES: data[0, size) stays valid and unchanged until `done`.
  void Persist(std::string key, const uint8_t* data, uint64_t size,
               std::vector<TensorPlacement> tensors, PersistCallback done) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes every version of `key` after the jobs before it; `done` (on the store's thread, or
  // at once when the key has no version on disk or queued) gets OK once the removal is durable.
  void Remove(std::string key, RemoveCallback done) ABSL_LOCKS_EXCLUDED(mu_);
  // Remove, waiting for it.
  absl::Status RemoveAndWait(std::string key) ABSL_LOCKS_EXCLUDED(mu_);

  DurableStoreStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    bool remove = false;
    std::string key;
    const uint8_t* data = nullptr;
    uint64_t size = 0;
    std::vector<TensorPlacement> tensors;
    PersistCallback persisted;
    RemoveCallback removed;
  };
  struct OnDisk {
    std::string path;
    uint64_t size = 0;
  };

  DurableStore(std::string directory, std::shared_ptr<FileSystem> file_system);
  absl::Status Recover(std::vector<DurableRecord>* recovered);
  // Runs `job` on worker_, after the jobs queued before it.
  void Queue(Job job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunPersist(Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  void RunRemove(Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `job`'s version (the header with `metadata`, then the bytes from
  // record.payload_offset) to `temporary` and makes it durable as record.path
  // (WriteFileAtomically).
  absl::Status WriteVersion(const Job& job, const DurableRecord& record,
                            const std::string& metadata, const std::string& temporary);

  const std::string directory_;
  const std::shared_ptr<FileSystem> file_system_;
  mutable absl::Mutex mu_;
  std::map<std::string, OnDisk> on_disk_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> persists_queued_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  DurableStoreStats stats_ ABSL_GUARDED_BY(mu_);
  WorkerPool worker_{1};  // last: destroyed (its jobs finished) first
};

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_DURABLE_STORE_H_
