#include "device/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/posix_error.h"

namespace tierd {
namespace {

constexpr char kShmDirectory[] = "/dev/shm";
constexpr char kPrefix[] = "tierd.";

absl::Status CheckName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 250) {
    return absl::InvalidArgumentError(absl::StrCat("bad shared memory name '", name, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& name,
                                                                   size_t bytes) {
  if (absl::Status status = CheckName(name); !status.ok()) return status;
  if (bytes == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return PosixError(absl::StrCat("shm_open ", name), errno);
  // posix_fallocate returns the error instead of setting errno.
  if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return PosixError(absl::StrCat("reserving ", bytes, " bytes of shared memory for ", name), rc);
  }
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int mmap_errno = errno;
  ::close(fd);
  if (data == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return PosixError(absl::StrCat("mmap ", name), mmap_errno);
  }
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(name, data, bytes, /*owner=*/true, /*read_only=*/false));
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& name) {
  return OpenMapping(name, /*read_only=*/false);
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::OpenReadOnly(const std::string& name) {
  return OpenMapping(name, /*read_only=*/true);
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::OpenMapping(const std::string& name,
                                                                        bool read_only) {
  if (absl::Status status = CheckName(name); !status.ok()) return status;
  int fd = ::shm_open(name.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC, 0);
  if (fd < 0) return PosixError(absl::StrCat("shm_open ", name), errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int saved = errno;
    ::close(fd);
    return PosixError(absl::StrCat("fstat ", name), saved);
  }
  if (st.st_size <= 0) {
    ::close(fd);
    return absl::NotFoundError(absl::StrCat("shared memory ", name, " is empty"));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* data =
      ::mmap(nullptr, bytes, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int mmap_errno = errno;
  ::close(fd);
  if (data == MAP_FAILED) return PosixError(absl::StrCat("mmap ", name), mmap_errno);
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(name, data, bytes, /*owner=*/false, read_only));
}

absl::Status SharedMemory::MakeWritable() {
  if (!read_only_) return absl::OkStatus();
  int fd = ::shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return PosixError(absl::StrCat("shm_open ", name_), errno);
  // MAP_FIXED replaces the read-only mapping in one step, so the range is never unmapped.
  void* data = ::mmap(data_, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  int mmap_errno = errno;
  ::close(fd);
  if (data == MAP_FAILED) return PosixError(absl::StrCat("mmap ", name_), mmap_errno);
  read_only_ = false;
  return absl::OkStatus();
}

SharedMemory::~SharedMemory() {
  ::munmap(data_, size_);
  if (owner_) ::shm_unlink(name_.c_str());
}

absl::StatusOr<uint64_t> SharedMemoryFreeBytes() {
  struct statvfs filesystem {};
  if (::statvfs(kShmDirectory, &filesystem) != 0) {
    return PosixError(absl::StrCat("statvfs ", kShmDirectory), errno);
  }
  return static_cast<uint64_t>(filesystem.f_bavail) * filesystem.f_frsize;
}

absl::StatusOr<uint64_t> SharedMemoryTotalBytes() {
  struct statvfs filesystem {};
  if (::statvfs(kShmDirectory, &filesystem) != 0) {
    return PosixError(absl::StrCat("statvfs ", kShmDirectory), errno);
  }
  return static_cast<uint64_t>(filesystem.f_blocks) * filesystem.f_frsize;
}

std::string SharedMemoryPrefixForPid(int pid) { return absl::StrCat("/", kPrefix, pid, "."); }

int RemoveStaleSharedMemory() {
  DIR* dir = ::opendir(kShmDirectory);
  if (dir == nullptr) return 0;
  int removed = 0;
  while (struct dirent* entry = ::readdir(dir)) {
    absl::string_view file = entry->d_name;
    if (!absl::ConsumePrefix(&file, kPrefix)) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(file, absl::MaxSplits('.', 1));
    int pid = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &pid) || pid <= 0) continue;
    // kill(pid, 0) fails with ESRCH only when no such process exists.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::shm_unlink(absl::StrCat("/", entry->d_name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace tierd
