// PeerDaemons' borrowing from the peers' host tiers (the node host tier's homes): host leases,
// the peers' arenas, and leases given back after the session they were lent on ended. The peers,
// their sessions and the GPU searches are in peer_daemons.cc.
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/exponent_codec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/node/detail/peer_daemons_state.h"
#include "server/node/host_lender.h"
#include "server/node/peer_daemons.h"
#include "server/proto_convert.h"
#include "wire/peer_arena.h"
#include "wire/session_core.h"

namespace tierd {

using peer_daemons_detail::ArenaName;
using peer_daemons_detail::ReleaseQuietly;
using peer_daemons_detail::SendRelease;

namespace {

// The HomeLease of a host lease `core`'s peer answered with.
absl::StatusOr<HomeLease> HomeLeaseOf(const std::shared_ptr<SessionCore>& core,
                                      const std::string& peer, const v1::Lease& lease) {
  ASSIGN_OR_RETURN(PeerArena * arena, core->host_arena(lease.host_buffer_id()));
  const uint64_t offset = lease.host_offset();
  // What lies at the offset: the raw bytes, or the compressed form.
  const uint64_t stored = lease.encoded_length() > 0 ? lease.encoded_length() : lease.length();
  if (offset > arena->size() || stored > arena->size() - offset) {
    return absl::InternalError(absl::StrCat(peer, " lent ", lease.key(), " at [", offset, ", +",
                                            stored, ") of an arena of ", arena->size(), " bytes"));
  }
  // The whole arena is registered ahead, the lease's own pieces first where they are not yet.
  arena->RegisterAllInBackground();
  if (stored > 0) RETURN_IF_ERROR(arena->EnsureRegistered(offset, stored));
  HomeLease home;
  home.data = arena->data() + offset;
  home.size = lease.length();
  if (lease.encoded_length() > 0) {
    // The header is read here, once; the tables and tiles are checked by the decoder as it goes.
    absl::StatusOr<codec::CompressedLayout> layout =
        codec::ParseCompressedHeader(home.data, stored);
    if (!layout.ok()) {
      return absl::DataLossError(
          absl::StrCat(peer, " lent ", lease.key(), " compressed: ", layout.status().message()));
    }
    if (layout->raw_bytes != lease.length() || layout->encoded_bytes != stored) {
      return absl::DataLossError(absl::StrCat(
          peer, " lent ", lease.key(), " compressed, of ", layout->raw_bytes, " bytes in ",
          layout->encoded_bytes, ", not ", lease.length(), " in ", stored));
    }
    home.compressed = *layout;
  }
  home.checksum = lease.checksum();
  home.arena = arena;
  return home;
}

}  // namespace

void PeerDaemons::BorrowHost(const std::string& socket, const std::string& key,
                             uint64_t source_fingerprint,
                             absl::AnyInvocable<void(absl::StatusOr<HomeLease>) &&> done) {
  Peer* peer = FindPeer(socket);
  if (peer == nullptr) {
    return std::move(done)(absl::NotFoundError(absl::StrCat(socket, " is not a peer")));
  }
  absl::StatusOr<std::shared_ptr<SessionCore>> core = SessionTo(*peer);
  if (core.ok() && node_daemon_ && ArenaName(**core).empty()) {
    // Opened without the arena, which could not be mapped here: once its back-off is over, a
    // session that asks for it again.
    bool retry = false;
    {
      absl::MutexLock lock(&peer->mu);
      retry = absl::Now() >= peer->arena_unusable_until;
    }
    if (retry) {
      Forget(*peer, *core);
      core = SessionTo(*peer);
    }
    if (core.ok() && ArenaName(**core).empty()) {
      return std::move(done)(
          absl::UnavailableError(absl::StrCat("peer ", socket,
                                              ": its host arena cannot be mapped here (tried again "
                                              "later)")));
    }
  }
  if (!core.ok()) {
    return std::move(done)(
        absl::UnavailableError(absl::StrCat("peer ", socket, ": ", core.status().message())));
  }
  v1::SessionRequest request;
  request.mutable_fetch()->set_key(key);
  request.mutable_fetch()->set_local_only(true);
  request.mutable_fetch()->set_host_lease(true);
  request.mutable_fetch()->set_source_fingerprint(source_fingerprint);
  // As in AskNext: a failed write may or may not call back; whichever comes first answers.
  auto shared_done =
      std::make_shared<absl::AnyInvocable<void(absl::StatusOr<HomeLease>) &&>>(std::move(done));
  auto claimed = std::make_shared<std::atomic<bool>>(false);
  std::weak_ptr<SessionCore> weak = *core;
  absl::Status sent = (*core)->Send(std::move(request), [this, peer, weak, claimed, shared_done](
                                                            const v1::SessionResponse& answer) {
    if (claimed->exchange(true)) return;
    std::shared_ptr<SessionCore> session = weak.lock();
    absl::Status status = StatusOf(answer);
    if (!status.ok() || !answer.has_lease() || session == nullptr) {
      if (absl::IsUnavailable(status) && session != nullptr) Forget(*peer, session);
      if (status.ok()) status = absl::UnavailableError("the session ended");
      return std::move(*shared_done)(
          absl::Status(status.code(), absl::StrCat("peer ", peer->socket, ": ", status.message())));
    }
    absl::StatusOr<HomeLease> lease = HomeLeaseOf(session, peer->socket, answer.lease());
    if (!lease.ok()) {
      ReleaseQuietly(*session, answer.lease().lease_id());
    } else {
      lease->release = [this, peer, session, arena = ArenaName(*session),
                        lease_id = answer.lease().lease_id()]() mutable {
        GiveBackHostLease(*peer, std::move(session), arena, lease_id);
      };
    }
    std::move (*shared_done)(std::move(lease));
  });
  if (!sent.ok() && !claimed->exchange(true)) {
    Forget(*peer, *core);
    std::move (*shared_done)(
        absl::UnavailableError(absl::StrCat("peer ", socket, ": ", sent.message())));
  }
}

absl::Status PeerDaemons::Connect(const std::string& socket) {
  Peer* peer = FindPeer(socket);
  if (peer == nullptr) return absl::NotFoundError(absl::StrCat(socket, " is not a peer"));
  return SessionTo(*peer).status();
}

uint64_t PeerDaemons::RegisteredArenaBytes() {
  ReleaseEndedSessions();
  uint64_t bytes = 0;
  for (const auto& peer : peers_) {
    std::shared_ptr<SessionCore> core;
    {
      // Not peer->mu, which a connection to a peer that does not answer may hold for long.
      absl::MutexLock lock(&peer->arena_mu);
      core = peer->arena_session;
    }
    if (core == nullptr) continue;
    if (absl::StatusOr<PeerArena*> arena = core->host_arena(HostLender::kArenaHandleId);
        arena.ok()) {
      bytes += std::min((*arena)->registered_pieces() * (*arena)->piece_bytes(), (*arena)->size());
    }
  }
  return bytes;
}

void PeerDaemons::PrefetchHost(const std::string& socket, const std::string& key) {
  Peer* peer = FindPeer(socket);
  if (peer == nullptr) return;
  absl::StatusOr<std::shared_ptr<SessionCore>> core = SessionTo(*peer);
  if (!core.ok()) {
    TIERD_LOG_EVERY_N_SEC(INFO, 10)
        << "peer " << socket << ": cannot prefetch " << key << ": " << core.status();
    return;
  }
  v1::SessionRequest request;
  request.mutable_prefetch()->add_keys(key);
  request.mutable_prefetch()->set_host_only(true);
  // Without a callback, a failure is logged by the session's reader.
  if (absl::Status sent = (*core)->Send(std::move(request)); !sent.ok()) Forget(*peer, *core);
}

void PeerDaemons::GiveBackHostLease(Peer& peer, std::shared_ptr<SessionCore> lent_on,
                                    const std::string& arena, uint64_t lease_id) {
  if (!lent_on->ended() && SendRelease(*lent_on, lease_id).ok()) return;
  // The session it was lent on has ended, not this daemon: the home holds the object for this
  // process until it is given back (or this process exits). On the next session, then.
  absl::StatusOr<std::shared_ptr<SessionCore>> now = SessionTo(peer);
  if (now.ok()) {
    if (ArenaName(**now) != arena) return;  // the home restarted: it holds nothing for us
    if (SendRelease(**now, lease_id).ok()) return;
  }
  absl::MutexLock lock(&peer.mu);
  if (peer.orphans_arena != arena) peer.orphaned_leases.clear();
  peer.orphans_arena = arena;
  peer.orphaned_leases.push_back(lease_id);
}

}  // namespace tierd
