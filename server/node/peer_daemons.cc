#include "server/node/peer_daemons.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/worker_pool.h"
#include "server/node/detail/peer_daemons_state.h"
#include "server/node/host_lender.h"
#include "server/proto_convert.h"
#include "wire/peer_arena.h"
#include "wire/session_core.h"
#include "wire/session_socket.h"
#include "wire/session_transport.h"
#include "wire/wire_format.h"

namespace tierd {
namespace peer_daemons_detail {

absl::Status SendRelease(SessionCore& core, uint64_t lease_id) {
  v1::SessionRequest request;
  request.mutable_release()->set_lease_id(lease_id);
  request.mutable_release()->set_quiet(true);
  return core.SendQuiet(std::move(request));
}

void ReleaseQuietly(SessionCore& core, uint64_t lease_id) { (void)SendRelease(core, lease_id); }

std::string ArenaName(SessionCore& core) {
  absl::StatusOr<PeerArena*> arena = core.host_arena(HostLender::kArenaHandleId);
  return arena.ok() ? (*arena)->name() : std::string();
}

}  // namespace peer_daemons_detail

using peer_daemons_detail::ArenaName;
using peer_daemons_detail::ReleaseQuietly;
using peer_daemons_detail::SendRelease;

namespace {

// A peer that could not be reached is passed over for 1 s, then 2, 4 ... up to 30 s.
constexpr absl::Duration kFirstBackoff = absl::Seconds(1);
constexpr absl::Duration kMaxBackoff = absl::Seconds(30);
// A peer's arena that could not be mapped is tried again after 2 s, then 4 ... up to 10 min.
constexpr absl::Duration kFirstArenaBackoff = absl::Seconds(2);
constexpr absl::Duration kMaxArenaBackoff = absl::Minutes(10);
// An attempt to open a session that failed after this long is a peer that hangs, not one that is
// not there.
constexpr absl::Duration kSlowAttempt = absl::Milliseconds(500);
// How long opening a session may wait for the peer's answer (connecting and the greeting have
// their own bound, in ConnectSessionSocket).
constexpr absl::Duration kOpenTimeout = absl::Seconds(5);

absl::Duration NextBackoff(absl::Duration last, absl::Duration first, absl::Duration most) {
  return last == absl::ZeroDuration() ? first : std::min(last * 2, most);
}

// Gives a lease back without waiting for the answer (a failure is only logged by the session's
// reader); an error when it could not be sent (the session has ended).

// The PeerCopy of a lease the peer answered with, whose handles `core` has opened.
absl::StatusOr<PeerCopy> CopyOfLease(const std::shared_ptr<SessionCore>& core,
                                     const std::string& peer, const v1::Lease& lease,
                                     bool through_host) {
  const uint8_t* base = nullptr;
  uint64_t region = 0;
  uint64_t offset = 0;
  if (through_host) {
    ASSIGN_OR_RETURN(const SharedMemory* buffer, core->host_buffer(lease.host_buffer_id()));
    base = static_cast<const uint8_t*>(buffer->data());
    region = buffer->size();
    offset = lease.host_offset();
  } else {
    ASSIGN_OR_RETURN(Slab * slab, core->slab(lease.slab_id()));
    base = static_cast<const uint8_t*>(slab->data());
    region = slab->size();
    offset = lease.offset();
  }
  if (lease.length() == 0 || offset > region || lease.length() > region - offset) {
    return absl::InternalError(absl::StrCat(peer, " lent ", lease.key(), " at [", offset, ", +",
                                            lease.length(), ") of a region of ", region, " bytes"));
  }
  Event* ready = nullptr;
  if (lease.has_ready_event_id()) {
    ASSIGN_OR_RETURN(ready, core->event(lease.ready_event_id()));
  }
  ASSIGN_OR_RETURN(std::vector<TensorPlacement> tensors,
                   FromProto(lease.tensors(), lease.length(), "lease.tensors"));
  PeerCopy copy;
  copy.data = base + offset;
  copy.size = lease.length();
  copy.ready = ready;
  copy.tensors = std::make_shared<const std::vector<TensorPlacement>>(std::move(tensors));
  copy.through_host = through_host;
  copy.peer = peer;
  copy.release = [core, lease_id = lease.lease_id()] { ReleaseQuietly(*core, lease_id); };
  return copy;
}

}  // namespace

absl::StatusOr<PeerCopyPath> ParsePeerCopyPath(absl::string_view text) {
  if (text == "auto") return PeerCopyPath::kAuto;
  if (text == "direct") return PeerCopyPath::kDirect;
  if (text == "host") return PeerCopyPath::kThroughHost;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown peer copy path \"", text, "\": auto, direct or host"));
}

const char* PeerCopyPathName(PeerCopyPath path) {
  switch (path) {
    case PeerCopyPath::kAuto:
      return "auto";
    case PeerCopyPath::kDirect:
      return "direct";
    case PeerCopyPath::kThroughHost:
      return "host";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<PeerDaemons>> PeerDaemons::Create(Device& device,
                                                                 PeerDaemonsOptions options) {
  for (const std::string& socket : options.sockets) {
    if (socket.empty() || socket[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("peer socket \"", socket, "\" is not an absolute path"));
    }
  }
  return std::unique_ptr<PeerDaemons>(new PeerDaemons(device, std::move(options)));
}

PeerDaemons::PeerDaemons(Device& device, PeerDaemonsOptions options)
    : device_(std::shared_ptr<Device>(), &device),
      client_name_(std::move(options.client_name)),
      path_(options.path),
      node_daemon_(options.node_daemon),
      answer_timeout_(options.answer_timeout) {
  for (std::string& socket : options.sockets) {
    if (socket == options.own_socket) continue;
    bool seen = false;
    for (const std::string& earlier : sockets_) seen = seen || earlier == socket;
    if (seen) continue;
    auto peer = std::make_unique<Peer>();
    peer->socket = socket;
    peer->session_socket = SessionSocketPathFor(socket);
    peer->worker = std::make_unique<WorkerPool>(1);
    peers_.push_back(std::move(peer));
    sockets_.push_back(std::move(socket));
  }
}

PeerDaemons::~PeerDaemons() {
  // No search is under way (the tiers are gone), but the thread that asked a peer may still be
  // setting the search's timeout, the answer having come first: the workers, then the timer, whose
  // timeouts left find their searches answered.
  for (auto& peer : peers_) peer->worker.reset();
  timer_.reset();
  for (auto& peer : peers_) {
    std::vector<std::shared_ptr<SessionCore>> sessions;
    {
      absl::MutexLock lock(&peer->mu);
      sessions.swap(peer->retired);
      sessions.push_back(std::move(peer->core));
      absl::MutexLock arena_lock(&peer->arena_mu);
      sessions.push_back(std::move(peer->arena_session));
    }
    // Each ends and joins its reader here, on this thread: a handler of a late answer may hold one
    // a moment longer, and drop it last on that reader.
    for (const std::shared_ptr<SessionCore>& session : sessions) {
      if (session != nullptr) session->Close();
    }
  }
}

void PeerDaemons::Fetch(const std::string& key, Callback done) {
  auto search = std::make_shared<Search>();
  search->key = key;
  search->done = std::move(done);
  AskNext(std::move(search));
}

void PeerDaemons::AskNext(std::shared_ptr<Search> search) {
  if (search->next >= peers_.size()) {
    std::string why =
        search->answers.empty() ? "no peers are configured" : absl::StrJoin(search->answers, "; ");
    return std::move(search->done)(
        absl::NotFoundError(absl::StrCat(search->key, " is not here nor at a peer (", why, ")")));
  }
  Peer& peer = *peers_[search->next++];
  // On the peer's own thread: a peer that does not answer a connect holds up that thread only,
  // never the session thread that asked (which serves every other session of the daemon).
  peer.worker->Post([this, &peer, search = std::move(search)]() mutable { Ask(peer, search); },
                    WorkerPool::kUrgent);
}

void PeerDaemons::Ask(Peer& peer, std::shared_ptr<Search> search) {
  absl::StatusOr<std::shared_ptr<SessionCore>> core = SessionTo(peer);
  if (!core.ok()) {
    search->answers.push_back(absl::StrCat(peer.socket, ": ", core.status().message()));
    return AskNext(std::move(search));
  }
  bool through_host = path_ == PeerCopyPath::kThroughHost;
  {
    absl::MutexLock lock(&peer.mu);
    through_host = through_host || peer.through_host;
  }
  v1::SessionRequest request;
  request.mutable_fetch()->set_key(search->key);
  request.mutable_fetch()->set_local_only(true);
  request.mutable_fetch()->set_through_host(through_host);
  // SessionCore::Send calls back when a failed write ends the session, but not when it had
  // already ended; and the peer may answer nothing at all. Whichever comes first handles it.
  auto claimed = std::make_shared<std::atomic<bool>>(false);
  std::weak_ptr<SessionCore> weak = *core;
  absl::Status sent = (*core)->Send(
      std::move(request),
      [this, search, &peer, weak, claimed, through_host](const v1::SessionResponse& answer) {
        if (claimed->exchange(true)) {
          // Answered after its time was up: what it lent goes back at once.
          if (std::shared_ptr<SessionCore> late = weak.lock();
              late != nullptr && answer.has_lease()) {
            ReleaseQuietly(*late, answer.lease().lease_id());
          }
          return;
        }
        OnAnswer(search, peer, weak.lock(), through_host, answer);
      });
  if (!sent.ok()) {
    if (claimed->exchange(true)) return;
    Forget(peer, *core);
    search->answers.push_back(absl::StrCat(peer.socket, ": ", sent.message()));
    return AskNext(std::move(search));
  }
  timer_->RunAfter(answer_timeout_, [this, search, &peer, weak, claimed]() mutable {
    if (claimed->exchange(true)) return;
    const std::string why =
        absl::StrCat("answered nothing within ", absl::FormatDuration(answer_timeout_));
    if (std::shared_ptr<SessionCore> wedged = weak.lock()) {
      Forget(peer, wedged);
      Unreachable(peer, why);
    }
    search->answers.push_back(absl::StrCat(peer.socket, ": ", why));
    AskNext(std::move(search));
  });
}

void PeerDaemons::Unreachable(Peer& peer, const std::string& why) {
  absl::MutexLock lock(&peer.mu);
  peer.backoff = NextBackoff(peer.backoff, kFirstBackoff, kMaxBackoff);
  peer.unreachable_until = absl::Now() + peer.backoff;
  peer.unreachable_why = why;
  TIERD_LOG_EVERY_N_SEC(WARNING, 10)
      << "peer " << peer.socket << ": " << why << "; not asked again for "
      << absl::FormatDuration(peer.backoff);
}

void PeerDaemons::OnAnswer(std::shared_ptr<Search> search, Peer& peer,
                           std::shared_ptr<SessionCore> session, bool through_host,
                           const v1::SessionResponse& answer) {
  absl::Status status = StatusOf(answer);
  if (!answer.has_lease()) {
    if (absl::IsUnavailable(status) && session != nullptr) Forget(peer, session);
    if (!absl::IsNotFound(status) && !absl::IsUnavailable(status)) {
      return std::move(search->done)(
          absl::Status(status.code(), absl::StrCat("peer ", peer.socket, ": ", status.message())));
    }
    search->answers.push_back(absl::StrCat(peer.socket, ": ", status.message()));
    return AskNext(std::move(search));
  }
  // A peer that has it answers for it, good or bad: the search ends with this peer.
  absl::StatusOr<PeerCopy> copy =
      !status.ok()         ? absl::StatusOr<PeerCopy>(status)
      : session == nullptr ? absl::StatusOr<PeerCopy>(absl::UnavailableError("session ended"))
                           : CopyOfLease(session, peer.socket, answer.lease(), through_host);
  if (copy.ok()) return std::move(search->done)(std::move(copy));
  if (session != nullptr) ReleaseQuietly(*session, answer.lease().lease_id());
  if (!through_host && path_ == PeerCopyPath::kAuto && session != nullptr &&
      !search->retried_through_host) {
    // Its memory cannot be opened here (no peer access between the GPUs, most likely): ask it
    // again, and from now on, through the host.
    {
      absl::MutexLock lock(&peer.mu);
      peer.through_host = true;
    }
    TIERD_LOG(WARNING) << "peer " << peer.socket << ": cannot read its staging ("
                       << copy.status().message()
                       << "); its objects are copied through pinned host memory from now on";
    search->retried_through_host = true;
    --search->next;
    return AskNext(std::move(search));
  }
  std::move(search->done)(absl::Status(
      copy.status().code(), absl::StrCat("peer ", peer.socket, " has ", search->key,
                                         " but lending it failed: ", copy.status().message())));
}

PeerDaemons::Peer* PeerDaemons::FindPeer(const std::string& socket) const {
  for (const auto& peer : peers_) {
    if (peer->socket == socket) return peer.get();
  }
  return nullptr;
}

void PeerDaemons::TakeEndedLocked(Peer& peer, std::vector<std::shared_ptr<SessionCore>>& unused) {
  peer.mu.AssertHeld();
  if (peer.core != nullptr && peer.core->ended()) peer.retired.push_back(std::move(peer.core));
  {
    absl::MutexLock arena_lock(&peer.arena_mu);
    if (peer.arena_session != nullptr && peer.arena_session->ended()) peer.arena_session.reset();
  }
  // Ended sessions nothing holds any more go, and with them the mapping of their home's arena: a
  // home that died must not stay mapped here (its /dev/shm space is freed only once nobody maps
  // it). Where this runs on the reader thread of one of them (a search asking its peer again),
  // the answer's handler holds that one: it stays.
  for (size_t i = 0; i < peer.retired.size();) {
    if (peer.retired[i].use_count() == 1) {
      unused.push_back(std::move(peer.retired[i]));
      peer.retired[i] = std::move(peer.retired.back());
      peer.retired.pop_back();
    } else {
      ++i;
    }
  }
}

void PeerDaemons::ReleaseEndedSessions() {
  for (const auto& peer : peers_) {
    std::vector<std::shared_ptr<SessionCore>> unused;  // destroyed after the lock
    // Not waiting for a connection to a peer that does not answer, which holds mu: next time.
    if (!peer->mu.TryLock()) continue;
    TakeEndedLocked(*peer, unused);
    peer->mu.Unlock();
  }
}

absl::StatusOr<std::shared_ptr<SessionCore>> PeerDaemons::SessionTo(Peer& peer) {
  std::vector<std::shared_ptr<SessionCore>> unused;  // destroyed after the lock
  absl::MutexLock lock(&peer.mu);
  TakeEndedLocked(peer, unused);
  if (peer.core != nullptr) return peer.core;
  const absl::Time now = absl::Now();
  if (now < peer.unreachable_until) {
    return absl::UnavailableError(absl::StrCat(
        peer.unreachable_why, "; asked again in ",
        absl::FormatDuration(absl::Ceil(peer.unreachable_until - now, absl::Milliseconds(100)))));
  }
  absl::StatusOr<std::shared_ptr<SessionCore>> opened =
      OpenSessionLocked(peer, node_daemon_ && now >= peer.arena_unusable_until);
  if (!opened.ok()) {
    // A peer that refuses at once (not started, or restarting) costs nothing to ask again; one
    // that kept this thread waiting (a full backlog, a greeting or an open answered late or never:
    // a peer that hangs) is passed over for a while.
    if (absl::Now() - now >= kSlowAttempt) {
      peer.backoff = NextBackoff(peer.backoff, kFirstBackoff, kMaxBackoff);
      peer.unreachable_until = absl::Now() + peer.backoff;
      peer.unreachable_why = std::string(opened.status().message());
    }
    return opened.status();
  }
  peer.backoff = absl::ZeroDuration();
  std::shared_ptr<SessionCore> core = *std::move(opened);
  TIERD_VLOG(1) << "peer " << peer.socket << ": session open";
  if (!peer.orphaned_leases.empty()) {
    // Leases given back while no session was open: to this home only if it is the same process.
    if (ArenaName(*core) == peer.orphans_arena) {
      for (uint64_t lease_id : peer.orphaned_leases) (void)SendRelease(*core, lease_id);
    }
    peer.orphaned_leases.clear();
  }
  peer.core = core;
  absl::MutexLock arena_lock(&peer.arena_mu);
  peer.arena_session = core;
  return core;
}

absl::StatusOr<std::shared_ptr<SessionCore>> PeerDaemons::OpenSessionLocked(Peer& peer,
                                                                            bool node_daemon) {
  peer.mu.AssertHeld();
  ASSIGN_OR_RETURN(std::unique_ptr<SessionTransport> transport,
                   ConnectSessionSocket(peer.session_socket));
  std::shared_ptr<SessionCore> core = SessionCore::Start(std::move(transport));
  v1::SessionRequest open;
  open.mutable_open()->set_client_name(client_name_);
  open.mutable_open()->set_protocol(SessionProtocolVersion());
  open.mutable_open()->set_node_daemon(node_daemon);
  // Not waited for without end: a peer that accepted and greeted may still answer nothing.
  auto answered = std::make_shared<absl::Notification>();
  auto opened = std::make_shared<absl::StatusOr<v1::SessionResponse>>(
      absl::UnavailableError("the session ended"));
  RETURN_IF_ERROR(
      core->Send(std::move(open), [answered, opened](const v1::SessionResponse& answer) {
        *opened = answer;
        if (absl::Status status = StatusOf(answer); !status.ok()) {
          *opened = status;
        }
        answered->Notify();
      }));
  if (!answered->WaitForNotificationWithTimeout(kOpenTimeout)) {
    // A failed session is ended here, on this thread, not its reader's.
    return absl::DeadlineExceededError(
        absl::StrCat("it answered no session's open within ", absl::FormatDuration(kOpenTimeout)));
  }
  if (!opened->ok()) return opened->status();
  const v1::SessionResponse& answer = **opened;
  if (answer.opened().backend() != device_->backend()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "runs the ", answer.opened().backend(), " backend, this daemon ", device_->backend()));
  }
  core->set_device(device_);
  if (absl::Status handles = core->Opened(answer); !handles.ok()) {
    if (!node_daemon) return handles;
    // Most likely its host arena (another IPC namespace or user): the session works without it,
    // and the objects homed there are read here, until it is tried again.
    peer.arena_backoff = NextBackoff(peer.arena_backoff, kFirstArenaBackoff, kMaxArenaBackoff);
    peer.arena_unusable_until = absl::Now() + peer.arena_backoff;
    TIERD_LOG(WARNING) << "peer " << peer.socket << ": " << handles
                       << "; its host arena is not used, the objects homed there are read here "
                       << "(tried again in " << absl::FormatDuration(peer.arena_backoff) << ")";
    return OpenSessionLocked(peer, /*node_daemon=*/false);
  }
  if (node_daemon) peer.arena_backoff = absl::ZeroDuration();
  // A peer that lends host memory sent its arena: registered ahead, in the background.
  if (absl::StatusOr<PeerArena*> arena = core->host_arena(HostLender::kArenaHandleId); arena.ok()) {
    (*arena)->RegisterAllInBackground();
  }
  return core;
}

void PeerDaemons::Forget(Peer& peer, const std::shared_ptr<SessionCore>& core) {
  absl::MutexLock lock(&peer.mu);
  if (peer.core != core) return;
  TIERD_LOG(INFO) << "peer " << peer.socket << ": session ended; the next fetch reconnects";
  peer.retired.push_back(std::move(peer.core));
}

}  // namespace tierd
