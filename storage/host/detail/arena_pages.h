// The operating system's side of the host arena's memory: mapping the region, asking for
// transparent huge pages, and faulting a piece's pages in before it is registered. Internal to
// storage/host/host_arena.cc and storage/host/detail/arena_pinner.cc; HostArenaOptions names
// PagePrefault.
//
// Registering host memory with a device faults in (and the kernel zeroes) every page it has not
// touched yet, one page at a time on the registering thread; that, not the registration itself,
// is what makes pinning slow. Faulting the pages in first, on several threads, and with huge pages
// where the system has them, leaves the registration only the locking to do.
#ifndef TIERD_STORAGE_HOST_DETAIL_ARENA_PAGES_H_
#define TIERD_STORAGE_HOST_DETAIL_ARENA_PAGES_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

// How a piece's pages are faulted in before the piece is registered.
enum class PagePrefault {
  kNone,      // not at all: the registration faults them in
  kPopulate,  // madvise(MADV_POPULATE_WRITE), one call a piece; kTouch where the kernel lacks it
  kTouch,     // a write of one byte per page
};

// "none", "populate", "touch".
const char* PagePrefaultName(PagePrefault prefault);
// The inverse of PagePrefaultName; nullopt for any other text.
std::optional<PagePrefault> ParsePagePrefault(absl::string_view text);

// Size and alignment of a transparent huge page on x86-64 and most arm64 kernels.
inline constexpr uint64_t kHugePageBytes = 2ull << 20;

// Maps `bytes` (> 0, a multiple of the page size) of private anonymous memory, aligned to
// kHugePageBytes when it is at least that large so that huge pages can back all of it. Release it
// with UnmapArenaRegion(data, bytes). Errors: RESOURCE_EXHAUSTED (or the errno's code) when the
// address space or memory is not there.
absl::StatusOr<uint8_t*> MapArenaRegion(uint64_t bytes);
// Maps the first `bytes` (> 0, a multiple of the page size) of the shared memory object open
// read-write as `fd`, MAP_SHARED, aligned as MapArenaRegion. Release it with UnmapArenaRegion.
// Errors: as MapArenaRegion.
absl::StatusOr<uint8_t*> MapSharedArenaRegion(int fd, uint64_t bytes);
void UnmapArenaRegion(uint8_t* data, uint64_t bytes);

// Asks the kernel to back [data, data + bytes) with transparent huge pages (MADV_HUGEPAGE).
// Errors: the errno's, e.g. INVALID_ARGUMENT where the kernel has no transparent huge pages. Never
// fatal to the caller: the region then uses small pages.
absl::Status AdviseHugePages(uint8_t* data, uint64_t bytes);

// Faults in every page of [data, data + bytes) for writing, as `prefault` says (kNone does
// nothing). Thread-safe; several threads may prefault disjoint ranges at once. kTouch writes a
// zero into each page: prefault only memory that holds nothing yet.
// Errors: RESOURCE_EXHAUSTED when the memory is not there (kPopulate; kTouch cannot report it and
// leaves it to the kernel's out-of-memory handling), or the errno's code.
absl::Status PrefaultPages(uint8_t* data, uint64_t bytes, PagePrefault prefault);

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_DETAIL_ARENA_PAGES_H_
