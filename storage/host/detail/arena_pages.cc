#include "storage/host/detail/arena_pages.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "device/pinned_host_buffer.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the name, not the kernel
#endif

namespace tierd {
namespace {

// Cleared the first time the kernel answers EINVAL: it predates MADV_POPULATE_WRITE.
std::atomic<bool> populate_write_supported{true};

void TouchPages(uint8_t* data, uint64_t bytes) {
  const uint64_t page = PageSize();
  volatile uint8_t* pages = data;
  for (uint64_t offset = 0; offset < bytes; offset += page) pages[offset] = 0;
}

}  // namespace

const char* PagePrefaultName(PagePrefault prefault) {
  switch (prefault) {
    case PagePrefault::kNone:
      return "none";
    case PagePrefault::kPopulate:
      return "populate";
    case PagePrefault::kTouch:
      return "touch";
  }
  return "unknown";
}

std::optional<PagePrefault> ParsePagePrefault(absl::string_view text) {
  for (PagePrefault prefault :
       {PagePrefault::kNone, PagePrefault::kPopulate, PagePrefault::kTouch}) {
    if (text == PagePrefaultName(prefault)) return prefault;
  }
  return std::nullopt;
}

namespace {

// Maps `bytes` with `prot` and `flags` (anonymous, or of `fd` from offset 0), starting on a huge
// page boundary when it is at least a huge page: over-maps by a huge page and trims.
absl::StatusOr<uint8_t*> MapAligned(uint64_t bytes, int prot, int flags, int fd) {
  const uint64_t slack = bytes >= kHugePageBytes ? kHugePageBytes : 0;
  void* mapped = ::mmap(nullptr, bytes + slack, prot, flags, fd, 0);
  if (mapped == MAP_FAILED) {
    return PosixError(absl::StrCat("mapping a host arena of ", FormatByteSize(bytes)), errno);
  }
  uint8_t* start = static_cast<uint8_t*>(mapped);
  if (slack == 0) return start;
  uint8_t* aligned = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(start) + kHugePageBytes - 1) & ~(kHugePageBytes - 1));
  const uint64_t head = aligned - start;
  if (head > 0) ::munmap(start, head);
  if (slack - head > 0) ::munmap(aligned + bytes, slack - head);
  return aligned;
}

}  // namespace

absl::StatusOr<uint8_t*> MapArenaRegion(uint64_t bytes) {
  return MapAligned(bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1);
}

absl::StatusOr<uint8_t*> MapSharedArenaRegion(int fd, uint64_t bytes) {
  // A file mapping starts where the kernel puts it, not where its alignment asks: reserve an
  // aligned range of address space first, then map the object over it.
  ASSIGN_OR_RETURN(uint8_t* const range,
                   MapAligned(bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1));
  if (::mmap(range, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    const int saved = errno;
    ::munmap(range, bytes);
    return PosixError(absl::StrCat("mapping a shared host arena of ", FormatByteSize(bytes)),
                      saved);
  }
  return range;
}

void UnmapArenaRegion(uint8_t* data, uint64_t bytes) { ::munmap(data, bytes); }

absl::Status AdviseHugePages(uint8_t* data, uint64_t bytes) {
  if (::madvise(data, bytes, MADV_HUGEPAGE) != 0) {
    return PosixError("asking for transparent huge pages (MADV_HUGEPAGE)", errno);
  }
  return absl::OkStatus();
}

absl::Status PrefaultPages(uint8_t* data, uint64_t bytes, PagePrefault prefault) {
  switch (prefault) {
    case PagePrefault::kNone:
      return absl::OkStatus();
    case PagePrefault::kPopulate:
      if (populate_write_supported.load(std::memory_order_relaxed)) {
        int result;
        do {
          result = ::madvise(data, bytes, MADV_POPULATE_WRITE);
        } while (result != 0 && errno == EINTR);
        if (result == 0) return absl::OkStatus();
        if (errno != EINVAL) {
          return PosixError(absl::StrCat("faulting in ", FormatByteSize(bytes),
                                         " of the host arena (MADV_POPULATE_WRITE)"),
                            errno);
        }
        populate_write_supported.store(false, std::memory_order_relaxed);
      }
      TouchPages(data, bytes);
      return absl::OkStatus();
    case PagePrefault::kTouch:
      TouchPages(data, bytes);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace tierd
