// The real file system: open(2), fdatasync(2), rename(2) and friends, errors through PosixError.
// FileSystem::Default() is one of these. Thread-safe and stateless.
#ifndef TIERD_STORAGE_POSIX_FILE_SYSTEM_H_
#define TIERD_STORAGE_POSIX_FILE_SYSTEM_H_

#include <string>
#include <vector>

#include "storage/file_system.h"

namespace tierd {

class PosixFileSystem : public FileSystem {
 public:
  PosixFileSystem() = default;

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
  absl::Status CreateDirectories(const std::string& directory) override;
  absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& directory) override;
  absl::StatusOr<Directory> OpenDirectory(const Directory* parent, const std::string& name,
                                          bool create) override;
  absl::StatusOr<ScopedFd> OpenAt(const Directory& dir, const std::string& name, int flags,
                                  mode_t mode) override;
  absl::StatusOr<EntryStatus> StatAt(const Directory& dir, const std::string& name) override;
  absl::Status RenameAt(const Directory& dir, const std::string& from,
                        const std::string& to) override;
  absl::Status RemoveAt(const Directory& dir, const std::string& name) override;
  absl::StatusOr<std::vector<std::string>> ListAt(const Directory& dir) override;
  absl::Status SyncDirectoryAt(const Directory& dir) override;
  absl::StatusOr<FileSystemSpace> Space(const Directory& dir) override;
  absl::Status LockFile(int fd, const std::string& path, LockWait wait) override;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_POSIX_FILE_SYSTEM_H_
