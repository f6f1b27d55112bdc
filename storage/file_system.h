// The one seam between storage and the file system, in the spirit of leveldb's Env and rocksdb's
// FileSystem: the disk reader, the spill writer, the durable store and the catalog open, sync,
// rename and remove files through a FileSystem, so that a test can wrap the real one
// (FileSystemWrapper, FaultInjectingFileSystem) to fail or slow chosen operations on chosen paths.
//
// Directories may be opened once and what is in them reached by name relative to them (the *at()
// calls), following no symbolic link: the remote cache's files, which other processes of the user
// share, are reached this way, so a path swapped for a link after it was opened leads nowhere else.
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
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
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

// A directory opened by FileSystem::OpenDirectory. `path` names it in messages, and to a wrapper
// deciding faults: an entry NAME in it is PATH/NAME.
struct Directory {
  ScopedFd fd{-1};
  std::string path;

  std::string PathOf(absl::string_view name) const { return absl::StrCat(path, "/", name); }
};

// What StatAt says of a directory's entry (itself, not what a link points to).
struct EntryStatus {
  bool regular = false;  // a regular file
  uint64_t size = 0;
  uint64_t inode = 0;
  uint32_t owner = 0;  // uid
  uint32_t mode = 0;   // st_mode
  absl::Time modified = absl::InfinitePast();
};

// The bytes a directory's file system has free (for an unprivileged user) and in all.
struct FileSystemSpace {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

enum class LockWait {
  kWait,        // until the lock is had
  kFailIfHeld,  // UNAVAILABLE at once while another open file description holds it
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

  // Opens the directory `name` in `parent` — or, with no parent, at the path `name` — following no
  // symbolic link; with `create`, makes it (mode 0700) when missing. Errors: those of mkdir(2) and
  // open(2); a symbolic link or a file there is FAILED_PRECONDITION.
  virtual absl::StatusOr<Directory> OpenDirectory(const Directory* parent, const std::string& name,
                                                  bool create) = 0;
  // Opens `name` in `dir` with open(2)'s `flags` (O_NOFOLLOW and O_CLOEXEC are added) and, for a
  // file it creates, `mode`. Errors: open(2)'s (NOT_FOUND, ALREADY_EXISTS with O_EXCL, ...).
  virtual absl::StatusOr<ScopedFd> OpenAt(const Directory& dir, const std::string& name, int flags,
                                          mode_t mode) = 0;
  // What `name` in `dir` is. NOT_FOUND when there is no such entry.
  virtual absl::StatusOr<EntryStatus> StatAt(const Directory& dir, const std::string& name) = 0;
  // Renames `from` to `to` in `dir`, replacing `to` atomically.
  virtual absl::Status RenameAt(const Directory& dir, const std::string& from,
                                const std::string& to) = 0;
  // Removes the file `name` from `dir`. NOT_FOUND when there is no such file.
  virtual absl::Status RemoveAt(const Directory& dir, const std::string& name) = 0;
  // The names of `dir`'s entries except "." and "..", sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListAt(const Directory& dir) = 0;
  // Makes `dir`'s entries durable: fsync.
  virtual absl::Status SyncDirectoryAt(const Directory& dir) = 0;
  // The space of `dir`'s file system.
  virtual absl::StatusOr<FileSystemSpace> Space(const Directory& dir) = 0;
  // Locks `fd` (a descriptor of `path`) exclusively, as flock(2) does: held until every
  // descriptor of its open file description is closed; locks of other descriptions conflict,
  // byte-range locks do not.
  virtual absl::Status LockFile(int fd, const std::string& path, LockWait wait) = 0;
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
  absl::StatusOr<Directory> OpenDirectory(const Directory* parent, const std::string& name,
                                          bool create) override {
    return target_->OpenDirectory(parent, name, create);
  }
  absl::StatusOr<ScopedFd> OpenAt(const Directory& dir, const std::string& name, int flags,
                                  mode_t mode) override {
    return target_->OpenAt(dir, name, flags, mode);
  }
  absl::StatusOr<EntryStatus> StatAt(const Directory& dir, const std::string& name) override {
    return target_->StatAt(dir, name);
  }
  absl::Status RenameAt(const Directory& dir, const std::string& from,
                        const std::string& to) override {
    return target_->RenameAt(dir, from, to);
  }
  absl::Status RemoveAt(const Directory& dir, const std::string& name) override {
    return target_->RemoveAt(dir, name);
  }
  absl::StatusOr<std::vector<std::string>> ListAt(const Directory& dir) override {
    return target_->ListAt(dir);
  }
  absl::Status SyncDirectoryAt(const Directory& dir) override {
    return target_->SyncDirectoryAt(dir);
  }
  absl::StatusOr<FileSystemSpace> Space(const Directory& dir) override {
    return target_->Space(dir);
  }
  absl::Status LockFile(int fd, const std::string& path, LockWait wait) override {
    return target_->LockFile(fd, path, wait);
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
