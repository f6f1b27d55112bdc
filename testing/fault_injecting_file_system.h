// A file system that fails or delays chosen operations on chosen paths, for tests and fuzzers: it
// wraps another file system (the POSIX one by default) and, before each operation, asks the
// decider set for that operation whether it fails. Failures look like the kernel's: the errno a
// decider names becomes the status PosixError gives it, with a message naming the path.
//
// Thread-safe: deciders may be set and replaced while other threads use the file system; a decider
// runs on the thread of the operation it decides, without any lock held, and may block (a slow
// disk) or count.
#ifndef TIERD_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_
#define TIERD_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"

namespace tierd {

enum class FileOperation {
  kOpenForRead,    // OpenForRead, buffered or direct; OpenAt to read only
  kOpenForWrite,   // OpenForWrite, buffered or direct; OpenAt to write or create
  kOpenDirect,     // either open with O_DIRECT (before the two above): a file system refusing it
  kRead,           // BeforeRead: one read the caller issues
  kWrite,          // BeforeWrite: one write the caller issues
  kSyncFile,       // SyncFile
  kSyncDirectory,  // SyncDirectory, SyncDirectoryAt
  kRename,         // Rename, RenameAt (of its source path)
  kRemove,         // RemoveFile, RemoveAt
  kOpenDirectory,  // OpenDirectory
  kLock,           // LockFile
};
inline constexpr int kFileOperationCount = 11;

class FaultInjectingFileSystem : public FileSystemWrapper {
 public:
  // For one call of an operation on `path`: 0 lets it through, an errno fails it with that error.
  using FaultDecider = std::function<int(const std::string& path)>;

  explicit FaultInjectingFileSystem(std::shared_ptr<FileSystem> target = FileSystem::Default())
      : FileSystemWrapper(std::move(target)) {}

  // Sets (or, with null, removes) the decider of `operation`.
  void SetFault(FileOperation operation, FaultDecider decider) ABSL_LOCKS_EXCLUDED(mu_);
  // Fails every call of `operation` on a path containing `path_part` with `error` (all paths when
  // `path_part` is empty): SetFault with a decider that says so.
  void FailAlways(FileOperation operation, const std::string& path_part, int error)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes every decider.
  void ClearFaults() ABSL_LOCKS_EXCLUDED(mu_);

  // Calls of `operation` so far, and how many of them were failed.
  uint64_t calls(FileOperation operation) const;
  uint64_t failures(FileOperation operation) const;

  absl::StatusOr<ScopedFd> OpenForRead(const std::string& path,
                                       const OpenForReadOptions& options) override;
  absl::StatusOr<ScopedFd> OpenForWrite(const std::string& path,
                                        const OpenForWriteOptions& options) override;
  absl::Status BeforeRead(const std::string& path) override;
  absl::Status BeforeWrite(const std::string& path) override;
  absl::Status SyncFile(int fd, const std::string& path) override;
  absl::Status SyncDirectory(const std::string& directory) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::StatusOr<Directory> OpenDirectory(const Directory* parent, const std::string& name,
                                          bool create) override;
  absl::StatusOr<ScopedFd> OpenAt(const Directory& dir, const std::string& name, int flags,
                                  mode_t mode) override;
  absl::Status RenameAt(const Directory& dir, const std::string& from,
                        const std::string& to) override;
  absl::Status RemoveAt(const Directory& dir, const std::string& name) override;
  absl::Status SyncDirectoryAt(const Directory& dir) override;
  absl::Status LockFile(int fd, const std::string& path, LockWait wait) override;

 private:
  // Counts the call and asks the decider: OK, or the error naming `what` and `path`.
  absl::Status Decide(FileOperation operation, absl::string_view what, const std::string& path)
      ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::array<std::shared_ptr<const FaultDecider>, kFileOperationCount> deciders_
      ABSL_GUARDED_BY(mu_);
  std::array<std::atomic<uint64_t>, kFileOperationCount> calls_{};
  std::array<std::atomic<uint64_t>, kFileOperationCount> failures_{};
};

}  // namespace tierd

#endif  // TIERD_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_
