// Fetches answered with a copy of a peer daemon's object (FetchOptions::ask_peers): the peers are
// asked on behalf of one client with an unlisted object; once a peer lends it, staging is
// allocated and the object copied in on the handoff stream.
//
// The copy is ordered by events only: the handoff stream waits on the peer's ready event, copies,
// and records the lease's ready event; the client's stream waits on that. The peer's lease is
// given back from the stream's completion callback, once the copy has read the peer's buffer.
// Nothing is kept: the range is freed with the lease.
//
// Internal to the GPU tier. Its state is guarded by the tier's lock.
#ifndef TIERD_GPU_DETAIL_PEER_LOADER_H_
#define TIERD_GPU_DETAIL_PEER_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/deferred_calls.h"
#include "device/device.h"
#include "gpu/chunked_copier.h"
#include "gpu/detail/client_table.h"
#include "gpu/detail/running_callbacks.h"
#include "gpu/detail/staging_loader.h"
#include "gpu/detail/staging_residency.h"
#include "gpu/detail/tier_parts.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/peer_source.h"
#include "gpu/staging_pool.h"

namespace tierd {

class PeerLoader {
 public:
  using Deferred = DeferredCalls::Calls;

  // What is its own beside the tier's shared parts; all must outlive it. The tier's lock guards
  // its state.
  struct Own {
    PeerSource* peers;       // null: Start must not be called
    Stream& handoff_stream;  // copies from peers' memory, which wait on the peers' events
    StagingLoader& loader;
  };
  PeerLoader(const TierParts& tier, const Own& own);
  PeerLoader(const PeerLoader&) = delete;
  PeerLoader& operator=(const PeerLoader&) = delete;

  // Asks the peers for `key` on behalf of `client`; `done` gets the lease, or the first error.
  // REQUIRES: the tier's lock; there are peers.
  void Start(GpuClient& client, const std::string& key, GpuLeaseCallback done, Deferred& deferred);
  // Peer fetches asked and not answered yet. REQUIRES: the tier's lock.
  uint64_t in_flight() const;

 private:
  void OnPeerCopy(StagingObject* object, absl::StatusOr<PeerCopy> copy) ABSL_LOCKS_EXCLUDED(mu_);
  void CopyFromPeer(StagingObject* object, std::shared_ptr<PeerCopy> copy, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex& mu_;
  Device& device_;
  PeerSource* const peers_;
  StagingPool& pool_;
  EventPool& events_;
  Stream& stream_;
  ChunkedCopier& copier_;
  StagingResidency& residency_;
  StagingLoader& loader_;
  RunningCallbacks& callbacks_;
  GpuTierStats& stats_ ABSL_GUARDED_BY(mu_);
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // asked, not answered yet
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_PEER_LOADER_H_
