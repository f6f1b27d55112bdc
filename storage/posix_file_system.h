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
};

}  // namespace tierd

#endif  // TIERD_STORAGE_POSIX_FILE_SYSTEM_H_
