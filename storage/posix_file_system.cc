#include "storage/posix_file_system.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/directory.h"
#include "common/posix_error.h"

namespace tierd {

absl::StatusOr<ScopedFd> PosixFileSystem::OpenForRead(const std::string& path,
                                                      const OpenForReadOptions& options) {
  const int flags = O_RDONLY | O_CLOEXEC | (options.direct ? O_DIRECT : 0);
  if (options.beneath != nullptr) return options.beneath->OpenBeneath(path, flags);
  ScopedFd fd(::open(path.c_str(), flags));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", path), errno);
  return fd;
}

absl::StatusOr<ScopedFd> PosixFileSystem::OpenForWrite(const std::string& path,
                                                       const OpenForWriteOptions& options) {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (options.direct ? O_DIRECT : 0);
  ScopedFd fd(::open(path.c_str(), flags, options.mode));
  if (fd.get() < 0) return PosixError(absl::StrCat("creating ", path), errno);
  return fd;
}

absl::Status PosixFileSystem::BeforeRead(const std::string&) { return absl::OkStatus(); }

absl::Status PosixFileSystem::BeforeWrite(const std::string&) { return absl::OkStatus(); }

absl::Status PosixFileSystem::SyncFile(int fd, const std::string& path) {
  if (::fdatasync(fd) != 0) return PosixError(absl::StrCat("fsync ", path), errno);
  return absl::OkStatus();
}

absl::Status PosixFileSystem::SyncDirectory(const std::string& directory) {
  ScopedFd fd(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", directory), errno);
  if (::fsync(fd.get()) != 0) return PosixError(absl::StrCat("fsync ", directory), errno);
  return fd.Close(directory);
}

absl::Status PosixFileSystem::Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return PosixError(absl::StrCat("renaming ", from, " to ", to), errno);
  }
  return absl::OkStatus();
}

absl::Status PosixFileSystem::RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0) return PosixError(absl::StrCat("removing ", path), errno);
  return absl::OkStatus();
}

absl::Status PosixFileSystem::CreateDirectories(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) return PosixError(absl::StrCat("creating ", directory), error.value());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> PosixFileSystem::ListDirectory(
    const std::string& directory) {
  return tierd::ListDirectory(directory);
}

}  // namespace tierd
