#include "storage/host/detail/arena_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "storage/host/detail/arena_pages.h"

namespace tierd {
namespace {

constexpr char kShmemHugePagesSetting[] = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

// The selected value of a setting the kernel prints as "always [never] deny": the bracketed one.
// Empty when the file cannot be read.
std::string SelectedKernelSetting(const char* path) {
  std::ifstream file(path);
  std::string word;
  while (file >> word) {
    if (word.size() > 2 && word.front() == '[' && word.back() == ']') {
      return word.substr(1, word.size() - 2);
    }
  }
  return "";
}

// The huge= option of the tmpfs mounted on /dev/shm, where shm_open puts its objects ("never"
// when it has none, the kernel's default). The last mount there is the one in use.
std::string DevShmHugeOption() {
  std::ifstream mounts("/proc/self/mounts");
  std::string device, mount_point, type, options, rest;
  std::string huge = "never";
  while (mounts >> device >> mount_point >> type >> options && std::getline(mounts, rest)) {
    if (mount_point != "/dev/shm") continue;
    huge = "never";
    for (absl::string_view option : absl::StrSplit(options, ',')) {
      if (absl::ConsumePrefix(&option, "huge=")) huge = std::string(option);
    }
  }
  return huge;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ArenaRegion>> ArenaRegion::MapPrivate(uint64_t bytes) {
  ASSIGN_OR_RETURN(uint8_t* const data, MapArenaRegion(bytes));
  return std::unique_ptr<ArenaRegion>(new ArenaRegion(data, bytes, "", -1));
}

absl::StatusOr<std::unique_ptr<ArenaRegion>> ArenaRegion::MapShared(const std::string& name,
                                                                    uint64_t bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("bad shared memory name '", name, "'"));
  }
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return PosixError(absl::StrCat("shm_open ", name), errno);
  // Sized, not reserved: the pieces are reserved one by one as they are pinned (Reserve).
  absl::StatusOr<uint8_t*> data;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    data = PosixError(absl::StrCat("sizing ", name, " to ", FormatByteSize(bytes)), errno);
  } else {
    data = MapSharedArenaRegion(fd, bytes);
  }
  if (!data.ok()) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return data.status();
  }
  return std::unique_ptr<ArenaRegion>(new ArenaRegion(*data, bytes, name, fd));
}

ArenaRegion::~ArenaRegion() {
  EndReservations();
  UnmapArenaRegion(data_, size_);
  if (!name_.empty()) ::shm_unlink(name_.c_str());
}

absl::Status ArenaRegion::AdviseHugePages() const {
  RETURN_IF_ERROR(tierd::AdviseHugePages(data_, size_));
  if (name_.empty()) return absl::OkStatus();
  // An object in /dev/shm gets transparent huge pages where that tmpfs is mounted with huge=,
  // unless shmem_enabled overrides every mount: "deny" turns them off, "force" on (its other
  // values govern only the kernel's internal shared memory mount). huge=advise is not enough here:
  // it honours MADV_HUGEPAGE in page faults, but Reserve's posix_fallocate, which has no mapping
  // to ask, takes small pages, and the faults then find them there.
  const std::string setting = SelectedKernelSetting(kShmemHugePagesSetting);
  if (setting == "force") return absl::OkStatus();
  const std::string huge = DevShmHugeOption();
  if (setting == "deny" || (huge != "always" && huge != "within_size")) {
    return absl::FailedPreconditionError(absl::StrCat(
        kShmemHugePagesSetting, " is [", setting, "] and /dev/shm is mounted with huge=", huge,
        " (a shared arena gets huge pages with huge=within_size or huge=always, or [force])"));
  }
  return absl::OkStatus();
}

absl::Status ArenaRegion::Reserve(uint64_t offset, uint64_t bytes) {
  if (name_.empty()) return absl::OkStatus();
  absl::ReaderMutexLock lock(&fd_mu_);
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("reserving shared memory of ", name_, " after its reservations ended"));
  }
  int result;
  do {
    // posix_fallocate returns the error instead of setting errno.
    result = ::posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  } while (result == EINTR);
  if (result != 0) {
    return PosixError(absl::StrCat("reserving ", FormatByteSize(bytes), " at ",
                                   FormatByteSize(offset), " of the shared host arena ", name_),
                      result);
  }
  return absl::OkStatus();
}

void ArenaRegion::EndReservations() {
  absl::MutexLock lock(&fd_mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace tierd
