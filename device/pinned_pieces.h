// Where host memory's pinned registrations end. The CUDA driver treats a copy that spans two
// registrations as pageable, so copies of pinned memory are split at these boundaries
// (gpu/chunked_copier.h). The daemon's own host arena (storage/host/host_arena.h) and another
// daemon's arena as mapped here (wire/peer_arena.h) describe their pieces through it.
#ifndef TIERD_DEVICE_PINNED_PIECES_H_
#define TIERD_DEVICE_PINNED_PIECES_H_

#include <cstdint>

namespace tierd {

// Implementations are thread-safe.
class PinnedPieceBoundaries {
 public:
  virtual ~PinnedPieceBoundaries() = default;
  // How many bytes from `host` to the end of the pinned piece it lies in. REQUIRES: `host` lies
  // in the memory this describes.
  virtual uint64_t BytesToPieceEnd(const uint8_t* host) const = 0;
};

}  // namespace tierd

#endif  // TIERD_DEVICE_PINNED_PIECES_H_
