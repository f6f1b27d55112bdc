// Another daemon's host arena (a HOST_ARENA handle: storage/host/host_arena.h, shared), mapped in
// this process read-only and registered with this process's device piece by piece, as the leases
// the home daemon lends reach them: an arena can be hundreds of GiB, of which a peer copies a few
// objects. OpenedHandles opens one per handle; the daemon that asked for the lease copies out of
// it to its own GPU.
//
// A copy out of it must not span two pieces (the driver treats a copy across two registrations as
// pageable): split copies at BytesToPieceEnd (PinnedPieceBoundaries).
//
// Where the device cannot register read-only memory (Device::RegisterReadOnlyHostMemory answers
// UNIMPLEMENTED), the first registration maps the object read-write instead, at the same address,
// and every piece is registered with RegisterHostMemory; this process still only reads it.
//
// Thread-safe.
#ifndef TIERD_WIRE_PEER_ARENA_H_
#define TIERD_WIRE_PEER_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"
#include "device/pinned_pieces.h"
#include "device/shared_memory.h"

namespace tierd {

class PeerArena : public PinnedPieceBoundaries {
 public:
  // Maps the shared memory object `name` read-only; registers nothing yet. `size` is the arena's
  // bytes (the object must have at least that many) and `piece_bytes` the size of its pieces,
  // counted from its start. Errors: INVALID_ARGUMENT when `size` is 0 or `piece_bytes` is 0 or
  // not a multiple of the page size; INTERNAL when the object is smaller than `size`;
  // SharedMemory::OpenReadOnly's (NOT_FOUND once the home daemon is gone).
  static absl::StatusOr<std::unique_ptr<PeerArena>> Open(const std::string& name, uint64_t size,
                                                         uint64_t piece_bytes,
                                                         std::shared_ptr<Device> device);
  // Stops the background registration, unregisters every registered piece and unmaps. REQUIRES:
  // no copy reads the arena any more, and no other call is under way.
  ~PeerArena() override;
  PeerArena(const PeerArena&) = delete;
  PeerArena& operator=(const PeerArena&) = delete;

  // Registers with the device every piece that [offset, offset + bytes) touches and that is not
  // registered yet, and returns once all of them are (those other threads are registering too).
  // A piece is registered once, however many callers want it. Errors: OUT_OF_RANGE for a range
  // beyond size(); the device's (the first piece that failed; it is tried again by the next call
  // that touches it).
  absl::Status EnsureRegistered(uint64_t offset, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // The shared memory object's name: it names the home daemon's process (/tierd.PID.arena).
  const std::string& name() const { return memory_->name(); }
  // The arena's first byte in this process; never changes.
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  uint64_t piece_bytes() const { return piece_bytes_; }
  // Bytes from `p` to the end of its piece (or of the arena). REQUIRES: data() <= p < data() +
  // size().
  uint64_t BytesToPieceEnd(const uint8_t* p) const override;
  // Pieces registered now.
  uint64_t registered_pieces() const ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a thread that registers every piece not registered yet, first to last, so that later
  // leases find their pieces ready: registering a piece of small pages takes a good part of a
  // second per GiB, which a load would otherwise wait for piece by piece. Only pieces the home has
  // faulted in are registered (the others each second, until all are); it stops at the first
  // failure (logged; EnsureRegistered tries that piece again) or when this is destroyed. Once.
  void RegisterAllInBackground() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class PieceState { kUnregistered, kRegistering, kRegistered };
  // How pieces are registered: unknown until the first registration succeeds or the device says
  // it cannot register read-only memory.
  enum class Mode { kUnknown, kReadOnly, kWritable };

  PeerArena(std::unique_ptr<SharedMemory> memory, uint64_t size, uint64_t piece_bytes,
            std::shared_ptr<Device> device);
  // Registers piece `index`, which the caller marked kRegistering; settles the mode first when it
  // is unknown (one thread at a time, the others waiting for it).
  absl::Status RegisterPiece(uint64_t index) ABSL_LOCKS_EXCLUDED(mu_);
  // The first registration: read-only, or read-write after remapping where the device cannot.
  absl::Status ProbeAndRegister(uint8_t* data, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t PieceSize(uint64_t index) const;
  // Whether the home has faulted piece `index` in (mincore of its first and last page).
  bool PiecePresent(uint64_t index) const;

  const std::unique_ptr<SharedMemory> memory_;
  const std::shared_ptr<Device> device_;
  uint8_t* const data_;
  const uint64_t size_;
  const uint64_t piece_bytes_;

  mutable absl::Mutex mu_;
  std::vector<PieceState> pieces_ ABSL_GUARDED_BY(mu_);
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kUnknown;
  bool probing_ ABSL_GUARDED_BY(mu_) = false;  // a thread is settling the mode
  // Set when remapping the object read-write failed: the mapping may be gone.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;   // the destructor tells the background thread
  std::thread background_ ABSL_GUARDED_BY(mu_);  // RegisterAllInBackground's
};

}  // namespace tierd

#endif  // TIERD_WIRE_PEER_ARENA_H_
