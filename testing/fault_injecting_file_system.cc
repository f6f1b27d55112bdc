#include "testing/fault_injecting_file_system.h"

#include <fcntl.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/posix_error.h"
#include "common/status_macros.h"

namespace tierd {
namespace {

size_t IndexOf(FileOperation operation) { return static_cast<size_t>(operation); }

}  // namespace

void FaultInjectingFileSystem::SetFault(FileOperation operation, FaultDecider decider) {
  auto shared = decider ? std::make_shared<const FaultDecider>(std::move(decider)) : nullptr;
  absl::MutexLock lock(&mu_);
  deciders_[IndexOf(operation)] = std::move(shared);
}

void FaultInjectingFileSystem::FailAlways(FileOperation operation, const std::string& path_part,
                                          int error) {
  SetFault(operation, [path_part, error](const std::string& path) {
    return absl::StrContains(path, path_part) ? error : 0;
  });
}

void FaultInjectingFileSystem::ClearFaults() {
  absl::MutexLock lock(&mu_);
  for (auto& decider : deciders_) decider.reset();
}

uint64_t FaultInjectingFileSystem::calls(FileOperation operation) const {
  return calls_[IndexOf(operation)].load();
}

uint64_t FaultInjectingFileSystem::failures(FileOperation operation) const {
  return failures_[IndexOf(operation)].load();
}

absl::Status FaultInjectingFileSystem::Decide(FileOperation operation, absl::string_view what,
                                              const std::string& path) {
  calls_[IndexOf(operation)].fetch_add(1);
  std::shared_ptr<const FaultDecider> decider;
  {
    absl::MutexLock lock(&mu_);
    decider = deciders_[IndexOf(operation)];
  }
  // Outside the lock: a decider may block for as long as it likes.
  const int error = decider != nullptr ? (*decider)(path) : 0;
  if (error == 0) return absl::OkStatus();
  failures_[IndexOf(operation)].fetch_add(1);
  return PosixError(absl::StrCat(what, " ", path, " (injected)"), error);
}

absl::StatusOr<ScopedFd> FaultInjectingFileSystem::OpenForRead(const std::string& path,
                                                               const OpenForReadOptions& options) {
  if (options.direct) RETURN_IF_ERROR(Decide(FileOperation::kOpenDirect, "opening", path));
  RETURN_IF_ERROR(Decide(FileOperation::kOpenForRead, "opening", path));
  return FileSystemWrapper::OpenForRead(path, options);
}

absl::StatusOr<ScopedFd> FaultInjectingFileSystem::OpenForWrite(
    const std::string& path, const OpenForWriteOptions& options) {
  if (options.direct) RETURN_IF_ERROR(Decide(FileOperation::kOpenDirect, "creating", path));
  RETURN_IF_ERROR(Decide(FileOperation::kOpenForWrite, "creating", path));
  return FileSystemWrapper::OpenForWrite(path, options);
}

absl::Status FaultInjectingFileSystem::BeforeRead(const std::string& path) {
  RETURN_IF_ERROR(Decide(FileOperation::kRead, "reading", path));
  return FileSystemWrapper::BeforeRead(path);
}

absl::Status FaultInjectingFileSystem::BeforeWrite(const std::string& path) {
  RETURN_IF_ERROR(Decide(FileOperation::kWrite, "writing", path));
  return FileSystemWrapper::BeforeWrite(path);
}

absl::Status FaultInjectingFileSystem::SyncFile(int fd, const std::string& path) {
  RETURN_IF_ERROR(Decide(FileOperation::kSyncFile, "fsync", path));
  return FileSystemWrapper::SyncFile(fd, path);
}

absl::Status FaultInjectingFileSystem::SyncDirectory(const std::string& directory) {
  RETURN_IF_ERROR(Decide(FileOperation::kSyncDirectory, "fsync", directory));
  return FileSystemWrapper::SyncDirectory(directory);
}

absl::Status FaultInjectingFileSystem::Rename(const std::string& from, const std::string& to) {
  RETURN_IF_ERROR(Decide(FileOperation::kRename, "renaming", from));
  return FileSystemWrapper::Rename(from, to);
}

absl::Status FaultInjectingFileSystem::RemoveFile(const std::string& path) {
  RETURN_IF_ERROR(Decide(FileOperation::kRemove, "removing", path));
  return FileSystemWrapper::RemoveFile(path);
}

absl::StatusOr<Directory> FaultInjectingFileSystem::OpenDirectory(const Directory* parent,
                                                                  const std::string& name,
                                                                  bool create) {
  RETURN_IF_ERROR(Decide(FileOperation::kOpenDirectory, "opening",
                         parent == nullptr ? name : parent->PathOf(name)));
  return FileSystemWrapper::OpenDirectory(parent, name, create);
}

absl::StatusOr<ScopedFd> FaultInjectingFileSystem::OpenAt(const Directory& dir,
                                                          const std::string& name, int flags,
                                                          mode_t mode) {
  const bool writes = (flags & (O_WRONLY | O_RDWR | O_CREAT)) != 0;
  RETURN_IF_ERROR(Decide(writes ? FileOperation::kOpenForWrite : FileOperation::kOpenForRead,
                         writes ? "creating" : "opening", dir.PathOf(name)));
  return FileSystemWrapper::OpenAt(dir, name, flags, mode);
}

absl::Status FaultInjectingFileSystem::RenameAt(const Directory& dir, const std::string& from,
                                                const std::string& to) {
  RETURN_IF_ERROR(Decide(FileOperation::kRename, "renaming", dir.PathOf(from)));
  return FileSystemWrapper::RenameAt(dir, from, to);
}

absl::Status FaultInjectingFileSystem::RemoveAt(const Directory& dir, const std::string& name) {
  RETURN_IF_ERROR(Decide(FileOperation::kRemove, "removing", dir.PathOf(name)));
  return FileSystemWrapper::RemoveAt(dir, name);
}

absl::Status FaultInjectingFileSystem::SyncDirectoryAt(const Directory& dir) {
  RETURN_IF_ERROR(Decide(FileOperation::kSyncDirectory, "fsync", dir.path));
  return FileSystemWrapper::SyncDirectoryAt(dir);
}

absl::Status FaultInjectingFileSystem::LockFile(int fd, const std::string& path, LockWait wait) {
  RETURN_IF_ERROR(Decide(FileOperation::kLock, "locking", path));
  return FileSystemWrapper::LockFile(fd, path, wait);
}

}  // namespace tierd
