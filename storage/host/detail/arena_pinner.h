// Pins the host arena's region piece by piece: the first piece on the caller's thread, the rest on
// a few threads of its own, each reserving a piece's memory (ArenaRegion::Reserve), faulting its
// pages in and then registering it with the Device. Pieces are handed out in order but finish in
// any order. Owns the registrations: it unregisters exactly the pieces it registered when it goes.
// Internal to storage/host/host_arena.cc, which keeps the allocator's state and hears of each piece
// through PinObserver.
#ifndef TIERD_STORAGE_HOST_DETAIL_ARENA_PINNER_H_
#define TIERD_STORAGE_HOST_DETAIL_ARENA_PINNER_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"
#include "storage/host/detail/arena_pages.h"
#include "storage/host/detail/arena_region.h"

namespace tierd {

// What the pinning threads report. Every call comes on a pinning thread, without the pinner's
// lock held, and may run at the same time as another call from another pinning thread.
class PinObserver {
 public:
  virtual ~PinObserver() = default;
  // [offset, offset + size) is registered: copies may use it from now on.
  virtual void PiecePinned(uint64_t offset, uint64_t size) = 0;
  // The piece at `offset` could not be pinned; no piece is started after this. Pieces other
  // threads had already started may still succeed or fail.
  virtual void PieceFailed(uint64_t offset, const absl::Status& status) = 0;
  // The pinning threads are done (every piece pinned, a failure, or Stop()). Called once, after
  // every other call.
  virtual void PinningEnded() = 0;
};

struct ArenaPinnerOptions {
  uint64_t piece_bytes = 1ull << 30;  // > 0, a multiple of the page size
  int threads = 1;                    // pinning threads after the first piece; at least 1
  PagePrefault prefault = PagePrefault::kTouch;
};

// Thread-safe. REQUIRES: `region` outlives the pinner.
class ArenaPinner {
 public:
  ArenaPinner(Device& device, ArenaRegion& region, const ArenaPinnerOptions& options);
  // Stop(), then unregisters every piece registered (a failure to unregister is logged).
  ~ArenaPinner();
  ArenaPinner(const ArenaPinner&) = delete;
  ArenaPinner& operator=(const ArenaPinner&) = delete;

  // Pins the first piece on the calling thread and returns its size. Errors: the prefault's or the
  // registration's. REQUIRES: called once, before Start.
  absl::StatusOr<uint64_t> PinFirstPiece() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the threads that pin every other piece, reporting to `observer`; they end by
  // themselves once every piece is pinned or one failed. Starts nothing (and reports nothing)
  // when the first piece was the whole region. REQUIRES: PinFirstPiece succeeded, Start is called
  // once, and `observer` outlives Stop() or the pinner.
  void Start(PinObserver& observer) ABSL_LOCKS_EXCLUDED(workers_mu_, mu_);
  // Lets each thread finish the registration it is in (one it has not begun is skipped), and
  // joins them all. Idempotent. The registered pieces stay registered until the pinner goes.
  void Stop() ABSL_LOCKS_EXCLUDED(workers_mu_, mu_);

  uint64_t piece_count() const { return piece_count_; }
  // Threads that pin after the first piece: the option, capped at the pieces left to pin.
  int threads() const { return threads_; }

 private:
  // Takes pieces until none is left, one failed, or Stop().
  void PinPieces(PinObserver& observer) ABSL_LOCKS_EXCLUDED(mu_);
  // Reserves, prefaults and registers one piece; `stopping` is checked before registering.
  absl::Status PinPiece(uint64_t index, bool* skipped) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t PieceOffset(uint64_t index) const { return index * options_.piece_bytes; }
  uint64_t PieceSize(uint64_t index) const;

  Device& device_;
  ArenaRegion& region_;
  uint8_t* const base_;
  const uint64_t capacity_;
  const ArenaPinnerOptions options_;
  const uint64_t piece_count_;
  const int threads_;

  absl::Mutex mu_;
  uint64_t next_piece_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> registered_ ABSL_GUARDED_BY(mu_);  // by piece index
  // Held by Start and Stop, so that Stop joins every thread Start made, whoever calls it.
  absl::Mutex workers_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(workers_mu_);
};

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_DETAIL_ARENA_PINNER_H_
