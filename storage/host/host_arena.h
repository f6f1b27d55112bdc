// The pinned host memory of the host tier: one region of --host-cache-bytes, page-aligned (huge
// page aligned when it is large enough), pinned (registered with the Device) in pieces, so the
// daemon is usable as soon as the first piece is pinned rather than after the whole arena — an
// arena can be hundreds of GiB. Create pins the first piece; the others are pinned in the
// background by HostArenaOptions::pin_threads threads (storage/host/detail/arena_pinner.h), which
// fault each piece's pages in before registering it (the faulting, not the registration, is what
// costs time), and transparent huge pages are asked for where the system has them. Pieces are
// handed out in order but finish in any order, so the pinned part may have holes while pinning is
// under way.
// A shared arena (HostArenaOptions::shared) is a POSIX shared memory object that the other daemons
// of the node map read-only by shared_memory_name() and copy from to their own GPUs; each piece's
// memory is reserved as it is pinned, so a /dev/shm too small for the arena fails a piece (see
// pin_status()) rather than crashing the daemon.
// Allocations come only from pinned pieces; they are page-aligned and page-sized, so O_DIRECT I/O
// can use them as they are.
//
// Each piece is its own registration, and the CUDA driver treats a copy that spans two
// registrations as pageable. Device copies from the arena must therefore be split at multiples of
// piece_bytes() (counted from base()); the GPU tier copies in chunks anyway.
//
// Thread-safe.
#ifndef TIERD_STORAGE_HOST_HOST_ARENA_H_
#define TIERD_STORAGE_HOST_HOST_ARENA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/free_ranges.h"
#include "device/device.h"
#include "device/pinned_pieces.h"
#include "storage/host/detail/arena_pages.h"
#include "storage/host/detail/arena_pinner.h"
#include "storage/host/detail/arena_region.h"

namespace tierd {

// Threads that pin a host arena when HostArenaOptions::pin_threads is 0: half the CPUs this
// process may run on, from 1 to 8 (more gain nothing once the memory bus is busy zeroing pages).
int DefaultPinThreads();

struct HostArenaOptions {
  uint64_t bytes = 0;                     // rounded up to whole pages
  uint64_t pin_piece_bytes = 1ull << 30;  // registered one piece at a time
  // Threads pinning the pieces after the first (capped at the pieces left); 0: DefaultPinThreads().
  // 1 pins one piece after another, as a single background thread.
  int pin_threads = 0;
  // How each piece's pages are faulted in before it is registered (arena_pages.h). Touching beat
  // MADV_POPULATE_WRITE on an H100 machine, 64 GiB on 8 threads: 2.9 s against 4.3 s, and 0.2 s
  // against 0.3-4.1 s for the first piece (bench/arena_pin_bench, bench/results/).
  PagePrefault prefault = PagePrefault::kTouch;
  // Ask for transparent huge pages (MADV_HUGEPAGE); where the system has none, small pages serve.
  // A shared arena has them only where /dev/shm is mounted with huge=within_size or huge=always
  // (or /sys/kernel/mm/transparent_hugepage/shmem_enabled is [force]): arena_region.h.
  bool huge_pages = true;
  // Back the arena with the POSIX shared memory object SharedMemoryPrefixForPid(getpid()) +
  // "arena" (mode 0600), which other processes of this user may map; unlinked when the arena goes
  // (creating a shared arena first removes, with RemoveStaleSharedMemory, the objects of tierd
  // processes that no longer run: an arena left by a crash). One shared arena per process at a
  // time.
  bool shared = false;
};

class HostArena;

// A block of the arena, owned: it goes back to the arena when the handle is destroyed or reset.
// Move-only. REQUIRES: the arena outlives its allocations.
class ArenaAllocation {
 public:
  ArenaAllocation() = default;
  ArenaAllocation(ArenaAllocation&& other) noexcept { *this = std::move(other); }
  ArenaAllocation& operator=(ArenaAllocation&& other) noexcept;
  ~ArenaAllocation() { reset(); }
  ArenaAllocation(const ArenaAllocation&) = delete;
  ArenaAllocation& operator=(const ArenaAllocation&) = delete;

  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }  // whole pages; 0 for an empty allocation
  // Frees the block now; the handle is then empty (size 0).
  void reset();

 private:
  friend class HostArena;
  ArenaAllocation(HostArena* arena, uint64_t offset, uint64_t size)
      : arena_(arena), offset_(offset), size_(size) {}

  HostArena* arena_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

class HostArena : public PinnedPieceBoundaries, private PinObserver {
 public:
  // Reserves the address range, pins the first piece before returning and the rest in the
  // background. Errors: INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED when the memory cannot be
  // mapped or the first piece cannot be pinned (with the reason: often the memlock limit, or a
  // full /dev/shm for a shared arena); ALREADY_EXISTS when this process has a shared arena. A later
  // piece that fails to pin is logged, no further piece is started, and the arena keeps the pieces
  // pinned so far, including those other threads finish afterwards (see pin_status()).
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(Device& device,
                                                           const HostArenaOptions& options);
  // Stops pinning (waiting for the registrations in progress), unregisters exactly the pieces that
  // were registered, and unmaps; a shared arena's name is unlinked (mappings other processes hold
  // stay valid until they unmap). REQUIRES: no copy or I/O uses the memory any more.
  ~HostArena() override;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // A page-aligned block of at least `bytes` from the pinned part (0 bytes: an empty allocation,
  // which takes nothing), or nullopt when no free hole is large enough (the caller evicts and
  // retries, or gives up). The block is freed when the returned handle goes.
  std::optional<ArenaAllocation> Allocate(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  uint8_t* data(const ArenaAllocation& allocation) const { return base_ + allocation.offset(); }
  uint8_t* base() const { return base_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t piece_bytes() const { return piece_bytes_; }
  // Bytes from `host` to the end of its piece (counted from base()). REQUIRES: `host` lies in the
  // arena.
  uint64_t BytesToPieceEnd(const uint8_t* host) const override;
  // The name other processes map a shared arena by (SharedMemory::OpenReadOnly); empty when the
  // arena is not shared.
  const std::string& shared_memory_name() const { return region_->shared_memory_name(); }
  // Threads pinning after the first piece (0 when the first piece was the whole arena).
  int pin_threads() const { return pinner_->piece_count() > 1 ? pinner_->threads() : 0; }
  // Bytes of the pieces pinned so far; not a prefix of the arena while pinning is under way.
  uint64_t pinned_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t used_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // The largest allocation that would succeed right now.
  uint64_t largest_free_block() const ABSL_LOCKS_EXCLUDED(mu_);
  // OK while pinning goes well; the error of the first piece that failed otherwise.
  absl::Status pin_status() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the whole arena is pinned, pinning failed, or `timeout` passed; true when all of
  // it is pinned.
  bool WaitUntilFullyPinned(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  // True while the background threads are still pinning: more memory is coming.
  bool pinning() const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `listener` on a pinning thread, without the arena's lock, each time another piece is
  // pinned and once when pinning ends (done, failed or stopped); never two calls at once.
  // Replaces an earlier listener;
  // nullptr removes it. Once this returns, a replaced listener is not running and will not run.
  // The listener must not call SetPinListener.
  void SetPinListener(std::function<void()> listener) ABSL_LOCKS_EXCLUDED(listener_mu_);

 private:
  friend class ArenaAllocation;
  HostArena(std::unique_ptr<ArenaRegion> region, uint64_t piece_bytes, absl::Time pin_start,
            std::unique_ptr<ArenaPinner> pinner);
  // Returns a block taken by Allocate.
  void Free(uint64_t offset, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // PinObserver: the pinning threads' reports.
  void PiecePinned(uint64_t offset, uint64_t size) override ABSL_LOCKS_EXCLUDED(mu_);
  void PieceFailed(uint64_t offset, const absl::Status& status) override ABSL_LOCKS_EXCLUDED(mu_);
  void PinningEnded() override ABSL_LOCKS_EXCLUDED(mu_);
  void NotifyPinListener() ABSL_LOCKS_EXCLUDED(listener_mu_);

  std::unique_ptr<ArenaRegion> region_;
  uint8_t* const base_;
  const uint64_t capacity_;
  const uint64_t piece_bytes_;
  const absl::Time pin_start_;
  std::unique_ptr<ArenaPinner> pinner_;  // goes before region_: it unregisters the pieces

  mutable absl::Mutex mu_;
  FreeRanges free_ ABSL_GUARDED_BY(mu_);
  uint64_t pinned_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  bool pinning_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status pin_status_ ABSL_GUARDED_BY(mu_);
  // Held while the listener runs, so that replacing it waits for a call in progress.
  absl::Mutex listener_mu_;
  std::function<void()> listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_HOST_ARENA_H_
