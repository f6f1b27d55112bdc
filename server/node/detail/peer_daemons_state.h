// What PeerDaemons' sources share (peer_daemons.cc: the peers, their sessions and the searches;
// peer_daemons_host.cc: borrowing from the peers' host tiers): a peer's state, a search's, and the
// releases sent on a peer's session. Private to server/node/.
#ifndef TIERD_SERVER_NODE_DETAIL_PEER_DAEMONS_STATE_H_
#define TIERD_SERVER_NODE_DETAIL_PEER_DAEMONS_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/worker_pool.h"
#include "server/node/peer_daemons.h"
#include "wire/session_core.h"

namespace tierd {

struct PeerDaemons::Peer {
  std::string socket;
  std::string session_socket;
  absl::Mutex mu;
  std::shared_ptr<SessionCore> core ABSL_GUARDED_BY(mu);
  // Its staging could not be opened here: it is asked to lend through the host (kAuto).
  bool through_host ABSL_GUARDED_BY(mu) = false;
  // Sessions that ended, kept until the PeerDaemons goes: a copy may still hold one (its opened
  // slab), and the last reference must not be dropped on the session's own reader thread.
  std::vector<std::shared_ptr<SessionCore>> retired ABSL_GUARDED_BY(mu);
  // Its host arena could not be mapped here: until then its sessions do not ask for it and nothing
  // is borrowed; then it is tried again (after a back-off that doubles each time it fails).
  absl::Time arena_unusable_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  absl::Duration arena_backoff ABSL_GUARDED_BY(mu) = absl::ZeroDuration();
  // It could not be reached (or answered nothing in time): not asked again until then, the
  // back-off doubling with each failure in a row.
  absl::Time unreachable_until ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  absl::Duration backoff ABSL_GUARDED_BY(mu) = absl::ZeroDuration();
  std::string unreachable_why ABSL_GUARDED_BY(mu);
  // Where the searches ask it: connecting may block, and must block no caller's thread.
  std::unique_ptr<WorkerPool> worker;
  // Host leases given back after the session that was lent them ended (its home holds their
  // objects for this process until told): given back on the next session, if its home is the same
  // process (its arena's name), else dropped with the home that restarted.
  std::vector<uint64_t> orphaned_leases ABSL_GUARDED_BY(mu);
  std::string orphans_arena ABSL_GUARDED_BY(mu);
  // The last session opened, for RegisteredArenaBytes; taken after mu, never held for long.
  absl::Mutex arena_mu ABSL_ACQUIRED_AFTER(mu);
  std::shared_ptr<SessionCore> arena_session ABSL_GUARDED_BY(arena_mu);
};

// One Fetch going through the peers.
struct PeerDaemons::Search {
  std::string key;
  Callback done;
  size_t next = 0;                    // the peer to ask next
  std::vector<std::string> answers;   // what the peers asked so far said
  bool retried_through_host = false;  // a peer failed direct and was asked again
};

namespace peer_daemons_detail {

// Gives lease `lease_id` back on `core`'s session, asking for no answer.
absl::Status SendRelease(SessionCore& core, uint64_t lease_id);
// SendRelease, whatever it says (the session's end releases the lease anyway).
void ReleaseQuietly(SessionCore& core, uint64_t lease_id);
// The name of the host arena `core`'s home sent; empty when it sent none.
std::string ArenaName(SessionCore& core);

}  // namespace peer_daemons_detail
}  // namespace tierd

#endif  // TIERD_SERVER_NODE_DETAIL_PEER_DAEMONS_STATE_H_
