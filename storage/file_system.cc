#include "storage/file_system.h"

#include "common/status_macros.h"
#include "storage/posix_file_system.h"

namespace tierd {

std::shared_ptr<FileSystem> FileSystem::Default() {
  static auto* const file_system = new std::shared_ptr<FileSystem>(new PosixFileSystem);
  return *file_system;
}

std::shared_ptr<FileSystem> FileSystemOrDefault(std::shared_ptr<FileSystem> file_system) {
  return file_system != nullptr ? std::move(file_system) : FileSystem::Default();
}

namespace {

absl::Status WriteAndSync(FileSystem& file_system, const std::string& temporary,
                          absl::Span<const absl::string_view> parts, mode_t mode) {
  OpenForWriteOptions options;
  options.mode = mode;
  ASSIGN_OR_RETURN(ScopedFd fd, file_system.OpenForWrite(temporary, options));
  for (absl::string_view part : parts) {
    RETURN_IF_ERROR(file_system.BeforeWrite(temporary));
    RETURN_IF_ERROR(WriteAll(fd.get(), part, temporary));
  }
  RETURN_IF_ERROR(file_system.SyncFile(fd.get(), temporary));
  return fd.Close(temporary);
}

}  // namespace

absl::Status WriteFileAtomically(FileSystem& file_system, const std::string& path,
                                 const std::string& temporary,
                                 absl::Span<const absl::string_view> parts, mode_t mode) {
  absl::Status status = WriteAndSync(file_system, temporary, parts, mode);
  if (status.ok()) status = file_system.Rename(temporary, path);
  if (!status.ok()) {
    // A temporary left behind is removed by the next start anyway; this is only tidiness.
    (void)file_system.RemoveFile(temporary);
    return status;
  }
  const size_t slash = path.rfind('/');
  return file_system.SyncDirectory(slash == std::string::npos ? "." : path.substr(0, slash));
}

}  // namespace tierd
