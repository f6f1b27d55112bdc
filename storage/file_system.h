// The one seam between storage and the file system, in the spirit of leveldb's Env and rocksdb's
// FileSystem: the disk reader, the spill writer, the durable store and the catalog open, sync,
// rename and remove files through a FileSystem, so that a test can wrap the real one
// (FileSystemWrapper, FaultInjectingFileSystem) to fail or slow chosen operations on chosen paths.
//
// Files are handed out as descriptors: the reader and the spill writer drive their own engines on
// them (io_uring, pread, pwrite) with registered buffers and several operations in flight. Such
// callers announce every read or write they issue themselves with BeforeRead / BeforeWrite, which
// a wrapper may fail or delay; the POSIX file system lets every one through at once.
//
// Every method may be called from any thread at once.
#ifndef TIERD_STORAGE_FILE_SYSTEM_H_
#define TIERD_STORAGE_FILE_SYSTEM_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/fd_io.h"
#include "storage/model_roots.h"

namespace tierd {

struct OpenForReadOptions {
  // O_DIRECT: offsets, lengths and buffers of reads must then be aligned to the logical block size.
  bool direct = false;
  // When set, `path` is a model file and is opened beneath its root, following no symbolic link
  // (ModelRoots::OpenBeneath). REQUIRES: outlives the call.
  const ModelRoots* beneath = nullptr;
};

struct OpenForWriteOptions {
  bool direct = false;  // O_DIRECT, as for reads
  mode_t mode = 0600;   // of a file that is created
};

class FileSystem {
 public:
  // The POSIX file system, shared and never destroyed.
  static std::shared_ptr<FileSystem> Default();

  FileSystem() = default;
  virtual ~FileSystem() = default;
  FileSystem(const FileSystem&) = delete;
  FileSystem& operator=(const FileSystem&) = delete;

  // Opens `path` read-only (close-on-exec). Errors: those of open(2) as PosixError — NOT_FOUND,
  // PERMISSION_DENIED, INVALID_ARGUMENT where the file system refuses O_DIRECT — and, with
  // `beneath`, ModelRoots::OpenBeneath's (PERMISSION_DENIED for a link or a path outside every
  // root).
  virtual absl::StatusOr<ScopedFd> OpenForRead(const std::string& path,
                                               const OpenForReadOptions& options) = 0;
  // Creates `path`, or truncates it, for writing (close-on-exec). Errors: those of open(2)
  // ("creating PATH: ..."), INVALID_ARGUMENT where the file system refuses O_DIRECT.
  virtual absl::StatusOr<ScopedFd> OpenForWrite(const std::string& path,
                                                const OpenForWriteOptions& options) = 0;

  // Called by a caller that reads (writes) a descriptor from this file system itself, before each
  // read (write) of `path` it issues. An error fails that read (write) as the disk's own error
  // would, and its message names the path. May block (a slow disk). OK from the POSIX file system.
  virtual absl::Status BeforeRead(const std::string& path) = 0;
  virtual absl::Status BeforeWrite(const std::string& path) = 0;

  // Makes the data written to `fd` (a descriptor of `path`) durable: fdatasync.
  virtual absl::Status SyncFile(int fd, const std::string& path) = 0;
  // Makes the entries of `directory` (files created, renamed or removed in it) durable: fsync.
  virtual absl::Status SyncDirectory(const std::string& directory) = 0;
  // rename(2): replaces `to` atomically.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // unlink(2). NOT_FOUND when there is no such file.
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Creates `directory` and any missing parents; OK when it exists.
  virtual absl::Status CreateDirectories(const std::string& directory) = 0;
  // The names of the entries in `directory` except "." and "..", sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& directory) = 0;
};

// Forwards every call to another file system: derive from it to change a few.
class FileSystemWrapper : public FileSystem {
 public:
  // REQUIRES: `target` is not null.
  explicit FileSystemWrapper(std::shared_ptr<FileSystem> target) : target_(std::move(target)) {}

  FileSystem& target() const { return *target_; }

  absl::StatusOr<ScopedFd> OpenForRead(const std::string& path,
                                       const OpenForReadOptions& options) override {
    return target_->OpenForRead(path, options);
  }
  absl::StatusOr<ScopedFd> OpenForWrite(const std::string& path,
                                        const OpenForWriteOptions& options) override {
    return target_->OpenForWrite(path, options);
  }
  absl::Status BeforeRead(const std::string& path) override { return target_->BeforeRead(path); }
  absl::Status BeforeWrite(const std::string& path) override { return target_->BeforeWrite(path); }
  absl::Status SyncFile(int fd, const std::string& path) override {
    return target_->SyncFile(fd, path);
  }
  absl::Status SyncDirectory(const std::string& directory) override {
    return target_->SyncDirectory(directory);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return target_->Rename(from, to);
  }
  absl::Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  absl::Status CreateDirectories(const std::string& directory) override {
    return target_->CreateDirectories(directory);
  }
  absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& directory) override {
    return target_->ListDirectory(directory);
  }

 private:
  const std::shared_ptr<FileSystem> target_;
};

// `file_system`, or the POSIX one when it is null: what an options struct's null means.
std::shared_ptr<FileSystem> FileSystemOrDefault(std::shared_ptr<FileSystem> file_system);

// Replaces `path` with `parts`, back to back, so that after a crash it holds either its old
// contents or the new ones, never a mix: they are written to `temporary` (created with `mode`, in
// the same directory), synced, renamed over `path`, and the directory synced. On error `temporary`
// is removed and `path` is as it was (unless only the directory's sync failed). Errors: the file
// system's (RESOURCE_EXHAUSTED for a full disk).
absl::Status WriteFileAtomically(FileSystem& file_system, const std::string& path,
                                 const std::string& temporary,
                                 absl::Span<const absl::string_view> parts, mode_t mode);

}  // namespace tierd

#endif  // TIERD_STORAGE_FILE_SYSTEM_H_
