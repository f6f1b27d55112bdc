// The daemons of the node's other GPUs (tierd --peers), as a PeerSource: this daemon asks them for
// the stored objects it does not have, as a client of theirs.
//
// Each peer gets one session on its session socket, opened on first use and again after the peer
// restarts. A fetch goes to the peers in the order given, with FetchRequest.local_only so a peer
// never asks further (two daemons that name each other do not loop). The first lease found is
// lent to the tier, one of two ways:
//  - direct: the peer's staging slab opened in this process (CUDA IPC with peer access, or the
//    host backend's shared memory) and its ready event;
//  - through the host (FetchRequest.through_host): the peer copies the object into its pinned
//    host handoff buffer, which this process maps and registers, and lends that range with the
//    event that completes once the bytes are there.
// With PeerCopyPath::kAuto a peer is asked for direct leases until its slab cannot be opened here
// (the GPUs have no peer access to each other); from then on, and for that fetch again, through
// the host. The lease is released, quietly, when the tier says its copy has read the buffer.
//
// Each peer is asked on a thread of its own: connecting (bounded: the connect and greeting within
// 5 s, the session's open within 5 s more) and writing to a peer block that thread only, never the
// caller's — which serves every other session of the daemon. A peer that keeps a connect waiting
// and then fails, or answers a fetch nothing within answer_timeout, is passed over for a while
// (1 s, doubling with each failure in a row up to 30 s; one that refuses at once is asked again
// at once); one whose host arena cannot be mapped here is asked for it
// again after 2 s (doubling up to 10 min).
//
// Thread-safe. Fetch never blocks; BorrowHost, Connect and PrefetchHost block while they connect.
// The callbacks run on a peer's thread, the timer's, or whichever thread reads the peer's session
// (SessionCore).
#ifndef TIERD_SERVER_NODE_PEER_DAEMONS_H_
#define TIERD_SERVER_NODE_PEER_DAEMONS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "codec/exponent_format.h"
#include "common/timer_thread.h"
#include "device/device.h"
#include "gpu/peer_source.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

class PeerArena;
class SessionCore;

// A home daemon's model object, lent where it lies in the home's host arena (FetchRequest
// .host_lease), mapped and registered here. The node's host tier (server/node/node_host_tier.h)
// copies from it.
struct HomeLease {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint64_t checksum = 0;  // the home's record of it; 0: none
  // Set when `data` holds the object's compressed form (its header checked here), `size` still
  // being the object's raw size.
  std::optional<codec::CompressedLayout> compressed;
  // The home's arena as mapped here: where its registrations end. Valid until `release`.
  const PeerArena* arena = nullptr;
  // Gives the lease back. Must be called once, after every read of `data` has completed. Keeps
  // the mapping alive until then. May block (when the session the lease came on has ended, it is
  // given back on a new one, to the same home process): call it where a connect may wait.
  absl::AnyInvocable<void() &&> release;
};

// tierd --peer-copy.
enum class PeerCopyPath {
  kAuto,         // direct where the peer's memory can be opened, through the host otherwise
  kDirect,       // direct only: a peer whose memory cannot be opened fails the fetch
  kThroughHost,  // always through the host
};

// Parses "auto", "direct" or "host"; INVALID_ARGUMENT otherwise.
absl::StatusOr<PeerCopyPath> ParsePeerCopyPath(absl::string_view text);
const char* PeerCopyPathName(PeerCopyPath path);

struct PeerDaemonsOptions {
  // The peers' gRPC sockets (their --socket); sessions go to the session socket beside each
  // (SessionSocketPathFor). This daemon's own socket may be among them: it is skipped.
  std::vector<std::string> sockets;
  std::string own_socket;
  PeerCopyPath path = PeerCopyPath::kAuto;
  // Shown in the peers' logs.
  std::string client_name = "tierd peer";
  // This daemon shares the node's host tier: its sessions ask the peers for their host arenas
  // (OpenSession.node_daemon), which are mapped and registered here ahead of any lease.
  bool node_daemon = false;
  // How long a peer may take to answer a fetch before the search moves on (--node-home-timeout-ms).
  absl::Duration answer_timeout = absl::Seconds(30);
};

class PeerDaemons : public PeerSource {
 public:
  // `device` is this daemon's: peers' slabs and events are opened with it. It must outlive this.
  // INVALID_ARGUMENT for an empty or relative socket path. Connects to nobody yet.
  static absl::StatusOr<std::unique_ptr<PeerDaemons>> Create(Device& device,
                                                             PeerDaemonsOptions options);
  // Ends the sessions (the peers release what they still lend). REQUIRES: every PeerCopy handed
  // out has been released, i.e. the tiers that use this are gone.
  ~PeerDaemons() override;
  PeerDaemons(const PeerDaemons&) = delete;
  PeerDaemons& operator=(const PeerDaemons&) = delete;

  void Fetch(const std::string& key, Callback done) override;

  // Asks the peer at `socket` (one of sockets()) for a host lease on model object `key`
  // (FetchRequest.source_fingerprint: `source_fingerprint`) and calls
  // `done` once with it — its pieces registered with this daemon's device — or the error:
  // NOT_FOUND for a socket that is not a peer, UNAVAILABLE when the peer cannot be reached, the
  // peer's answer otherwise. Blocks while it connects (a round trip, unless the peer hangs);
  // `done` runs on the thread that reads the peer's session, and registering a piece of the
  // peer's arena for the first time blocks that thread.
  void BorrowHost(const std::string& socket, const std::string& key, uint64_t source_fingerprint,
                  absl::AnyInvocable<void(absl::StatusOr<HomeLease>) &&> done);
  // Opens the session to the peer at `socket` now, unless one is open: its host arena, when it
  // sends one, is then registered here in the background. Blocks as BorrowHost does. NOT_FOUND
  // for a socket that is not a peer; the connection's errors.
  absl::Status Connect(const std::string& socket);
  // Bytes of the peers' host arenas (those of the sessions open now) registered here. Lets go of
  // sessions that have ended and that nothing uses any more first (ReleaseEndedSessions).
  uint64_t RegisteredArenaBytes();
  // Lets go of the sessions to peers that have ended and that no copy uses any more, unmapping the
  // host arenas of homes that are gone. Each fetch does it too; so do the stats, periodically.
  void ReleaseEndedSessions();
  // Asks the peer at `socket` to bring `key` into its host cache (a host-only prefetch); a failure
  // is logged. Blocks as BorrowHost does.
  void PrefetchHost(const std::string& socket, const std::string& key);

  const std::vector<std::string>& sockets() const { return sockets_; }

 private:
  struct Peer;
  struct Search;
  PeerDaemons(Device& device, PeerDaemonsOptions options);

  // Asks peer `search->next` (on that peer's thread) and, when it does not have the key, the ones
  // after it; answers NOT_FOUND once every peer has been asked.
  void AskNext(std::shared_ptr<Search> search);
  // Asks `peer` for the search's key, on `peer`'s thread. An answer that does not come within
  // answer_timeout_ counts as none: the search moves on, and the peer is passed over a while.
  void Ask(Peer& peer, std::shared_ptr<Search> search);
  // `peer` failed to answer (`why`): passed over for a back-off that doubles each time.
  void Unreachable(Peer& peer, const std::string& why);
  // Handles `peer`'s answer to a fetch `session` sent (null once the session is gone).
  void OnAnswer(std::shared_ptr<Search> search, Peer& peer, std::shared_ptr<SessionCore> session,
                bool through_host, const v1::SessionResponse& answer);
  // The open session to `peer`, connecting when there is none or the last one ended.
  absl::StatusOr<std::shared_ptr<SessionCore>> SessionTo(Peer& peer);
  // Connects and opens a session (asking for the peer's host arena with `node_daemon`; without
  // it, from then on, when the arena cannot be mapped here). REQUIRES: peer.mu held.
  absl::StatusOr<std::shared_ptr<SessionCore>> OpenSessionLocked(Peer& peer, bool node_daemon);
  Peer* FindPeer(const std::string& socket) const;
  // Gives back host lease `lease_id`, lent on session `lent_on` by the home whose arena is named
  // `arena`: on that session while it lasts, else on the next one to the same home process (now,
  // connecting if need be, or when one opens). Blocks as BorrowHost does.
  void GiveBackHostLease(Peer& peer, std::shared_ptr<SessionCore> lent_on, const std::string& arena,
                         uint64_t lease_id);
  // Moves `peer`'s session to the retired ones if it has ended, and the retired sessions nothing
  // uses any more to `unused`. REQUIRES: peer.mu held.
  void TakeEndedLocked(Peer& peer, std::vector<std::shared_ptr<SessionCore>>& unused);
  // Drops `core` as `peer`'s session if it still is: the next fetch reconnects.
  void Forget(Peer& peer, const std::shared_ptr<SessionCore>& core);

  std::shared_ptr<Device> device_;  // not owned
  const std::string client_name_;
  const PeerCopyPath path_;
  const bool node_daemon_;
  std::vector<std::string> sockets_;
  std::vector<std::unique_ptr<Peer>> peers_;
  const absl::Duration answer_timeout_;
  // The searches' answer timeouts. Reset first by the destructor.
  std::unique_ptr<TimerThread> timer_ = std::make_unique<TimerThread>();
};

}  // namespace tierd

#endif  // TIERD_SERVER_NODE_PEER_DAEMONS_H_
