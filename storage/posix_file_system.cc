#include "storage/posix_file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
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

absl::StatusOr<Directory> PosixFileSystem::OpenDirectory(const Directory* parent,
                                                         const std::string& name, bool create) {
  const int at = parent == nullptr ? AT_FDCWD : parent->fd.get();
  Directory dir;
  dir.path = parent == nullptr ? name : parent->PathOf(name);
  if (create && ::mkdirat(at, name.c_str(), 0700) != 0 && errno != EEXIST) {
    return PosixError(absl::StrCat("creating ", dir.path), errno);
  }
  dir.fd = ScopedFd(::openat(at, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.fd.get() < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir.path, " must be a directory, not a symbolic link or a file"));
    }
    return PosixError(absl::StrCat("opening ", dir.path), errno);
  }
  return dir;
}

absl::StatusOr<ScopedFd> PosixFileSystem::OpenAt(const Directory& dir, const std::string& name,
                                                 int flags, mode_t mode) {
  ScopedFd fd(::openat(dir.fd.get(), name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode));
  if (fd.get() < 0) {
    return PosixError(
        absl::StrCat((flags & O_CREAT) != 0 ? "creating " : "opening ", dir.PathOf(name)), errno);
  }
  return fd;
}

absl::StatusOr<EntryStatus> PosixFileSystem::StatAt(const Directory& dir, const std::string& name) {
  struct stat status = {};
  if (::fstatat(dir.fd.get(), name.c_str(), &status, AT_SYMLINK_NOFOLLOW) != 0) {
    return PosixError(dir.PathOf(name), errno);
  }
  EntryStatus entry;
  entry.regular = S_ISREG(status.st_mode);
  entry.size = static_cast<uint64_t>(status.st_size);
  entry.inode = static_cast<uint64_t>(status.st_ino);
  entry.owner = status.st_uid;
  entry.mode = status.st_mode;
  entry.modified = absl::TimeFromTimespec(status.st_mtim);
  return entry;
}

absl::Status PosixFileSystem::RenameAt(const Directory& dir, const std::string& from,
                                       const std::string& to) {
  if (::renameat(dir.fd.get(), from.c_str(), dir.fd.get(), to.c_str()) != 0) {
    return PosixError(absl::StrCat("renaming ", dir.PathOf(from), " to ", to), errno);
  }
  return absl::OkStatus();
}

absl::Status PosixFileSystem::RemoveAt(const Directory& dir, const std::string& name) {
  if (::unlinkat(dir.fd.get(), name.c_str(), 0) != 0) {
    return PosixError(absl::StrCat("removing ", dir.PathOf(name)), errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> PosixFileSystem::ListAt(const Directory& dir) {
  // A description of its own: readdir's offset is the description's.
  DIR* listing = ::fdopendir(::openat(dir.fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (listing == nullptr) return PosixError(absl::StrCat("listing ", dir.path), errno);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* entry = ::readdir(listing)) {
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  const int error = errno;
  ::closedir(listing);
  if (error != 0) return PosixError(absl::StrCat("listing ", dir.path), error);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status PosixFileSystem::SyncDirectoryAt(const Directory& dir) {
  if (::fsync(dir.fd.get()) != 0) return PosixError(absl::StrCat("fsync ", dir.path), errno);
  return absl::OkStatus();
}

absl::StatusOr<FileSystemSpace> PosixFileSystem::Space(const Directory& dir) {
  struct statvfs space = {};
  if (::fstatvfs(dir.fd.get(), &space) != 0) {
    return PosixError(absl::StrCat("the free space of ", dir.path), errno);
  }
  return FileSystemSpace{static_cast<uint64_t>(space.f_bavail) * space.f_frsize,
                         static_cast<uint64_t>(space.f_blocks) * space.f_frsize};
}

absl::Status PosixFileSystem::LockFile(int fd, const std::string& path, LockWait wait) {
  const int operation = LOCK_EX | (wait == LockWait::kFailIfHeld ? LOCK_NB : 0);
  while (::flock(fd, operation) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat(path, " is locked by another process"));
    }
    return PosixError(absl::StrCat("locking ", path), errno);
  }
  return absl::OkStatus();
}

}  // namespace tierd
