// Where a GpuTier finds the stored objects it does not have: the daemons of the node's other GPUs
// (tierd --peers). The tier asks a PeerSource for a key and gets a PeerCopy: the object's bytes
// readable by the tier's own device, an event to wait on before reading them, and a release to
// call once the reads are done. PeerDaemons (server/node/peer_daemons.h) is the implementation;
// tests may supply their own.
#ifndef TIERD_GPU_PEER_SOURCE_H_
#define TIERD_GPU_PEER_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "device/device.h"
#include "storage/model.h"

namespace tierd {

// A peer's object, held for this daemon until `release` runs.
struct PeerCopy {
  // The bytes: the peer's staging buffer opened in this process (its GPU's memory, reachable peer
  // to peer), or pinned host memory the peer copies them into when the GPUs cannot reach each
  // other. Valid until `release`.
  const void* data = nullptr;
  uint64_t size = 0;
  // Work enqueued after a wait on it sees the bytes; null when they are there already. Owned by
  // the source; valid until `release`.
  Event* ready = nullptr;
  std::shared_ptr<const std::vector<TensorPlacement>> tensors;
  bool through_host = false;  // the bytes are in pinned host memory
  std::string peer;           // which daemon, for messages
  // Gives the object back to the peer. REQUIRES: every read of `data` has completed. Must not
  // block; may be called from any thread, once.
  absl::AnyInvocable<void() &&> release;
};

class PeerSource {
 public:
  using Callback = absl::AnyInvocable<void(absl::StatusOr<PeerCopy>) &&>;

  virtual ~PeerSource() = default;

  // Looks for `key` at the peers, in order, and calls `done` once with the first copy found, or
  // NOT_FOUND when no peer has it (the message says what each peer answered). `done` may run
  // before Fetch returns, on the caller's thread (when no peer can be asked), or later on another
  // thread: call it holding no lock that `done` takes. `done` must not block.
  virtual void Fetch(const std::string& key, Callback done) = 0;
};

}  // namespace tierd

#endif  // TIERD_GPU_PEER_SOURCE_H_
