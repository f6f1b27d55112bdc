#include "server/node/node_host_tier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "wire/peer_arena.h"

namespace tierd {

// One fetch of an object homed elsewhere: answered once, by the home's lease, its refusal or the
// timeout, whichever comes first.
struct NodeHostTier::Ask {
  std::string key;
  std::string home;
  ReadPriority priority;
  absl::Time deadline;
  absl::Time asked;                 // when the request was queued for the home
  ObjectRef object;                 // this daemon's registration of it
  uint64_t source_fingerprint = 0;  // ObjectSourceFingerprint of `object`
  Callback done;
  std::atomic<bool> answered{false};

  // True for the first caller only: it answers.
  bool Claim() { return !answered.exchange(true); }
};

NodeHostTier::NodeHostTier(const Catalog& catalog, LocalHostSource& local, PeerDaemons& peers,
                           NodeHomes homes, const NodeHostTierOptions& options)
    : catalog_(catalog), local_(local), peers_(peers), homes_(std::move(homes)), options_(options) {
  for (const std::string& member : homes_.members()) {
    if (member != homes_.self()) homes_state_[member].worker = std::make_unique<WorkerPool>(1);
  }
  for (const auto& [peer, home] : homes_state_) ConnectAhead(peer);
}

NodeHostTier::~NodeHostTier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // Answers from homes and timer calls may come later still (a home answers when it will; the
  // peers' sessions outlive this): they find this gone, and do nothing.
  alive_->MarkGone();
  // The peers' threads first, while the timer they may use lives; its connects left pending then
  // see stopping_ and do nothing.
  for (auto& [peer, home] : homes_state_) home.worker.reset();
}

void NodeHostTier::ConnectAhead(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  homes_state_.at(peer).worker->Post([this, peer] {
    if (absl::Status connected = peers_.Connect(peer); !connected.ok()) {
      TIERD_VLOG(1) << "node peer " << peer << " not reached yet: " << connected;
      timer_.RunAfter(absl::Seconds(1), [this, peer, alive = alive_] {
        alive->RunIfAlive([&] { ConnectAhead(peer); });
      });
    }
  });
}

const std::string* NodeHostTier::HomeToAsk(const std::string& key, ObjectRef* object) const {
  if (homes_state_.empty() || homes_.IsHomedHere(key)) return nullptr;
  // Stored objects (and unknown keys, which the own cache refuses) are not homed; an object read
  // here already (a fallback) is served from here.
  absl::StatusOr<ObjectRef> ref = catalog_.Lookup(key);
  if (!ref.ok() || local_.IsResident(key)) return nullptr;
  if (object != nullptr) *object = *std::move(ref);
  return &homes_.HomeOf(key);
}

void NodeHostTier::Fetch(const std::string& key, ReadPriority priority, absl::Time deadline,
                         Callback done, HostCache::LandedCallback landed) {
  auto ask = std::make_shared<Ask>();
  const std::string* home = HomeToAsk(key, &ask->object);
  if (home == nullptr) {
    return local_.Fetch(key, priority, deadline, std::move(done), std::move(landed));
  }
  ask->key = key;
  ask->home = *home;
  ask->priority = priority;
  ask->deadline = deadline;
  ask->source_fingerprint = ObjectSourceFingerprint(*ask->object.model, *ask->object.object);
  ask->done = std::move(done);
  if (Paused(*home)) {
    ask->Claim();
    return FallBack(std::move(ask), absl::UnavailableError(absl::StrCat(
                                        "it did not answer within ",
                                        absl::FormatDuration(options_.home_timeout), " lately")));
  }
  ask->asked = absl::Now();
  WatchHome(ask, options_.home_timeout);
  Home& at = homes_state_.at(*home);
  at.worker->Post(
      [this, ask, &at] {
        if (ask->answered) return;  // it timed out while queued here: nothing to ask for
        peers_.BorrowHost(
            ask->home, ask->key, ask->source_fingerprint,
            [this, ask, &at, alive = alive_](absl::StatusOr<HomeLease> lease) {
              // After this tier has stopped, the lease goes with the process (its home holds it
              // for this process until it exits).
              alive->RunIfAlive([&] {
                at.last_answer_ns.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
                if (!lease.ok()) {
                  if (ask->Claim()) FallBack(ask, lease.status());
                  return;
                }
                if (!ask->Claim()) {  // timed out: the object is being read here already
                  GiveBack(at, std::move(lease->release));
                  return;
                }
                absl::StatusOr<HostBytes> bytes = Accept(ask, *std::move(lease));
                if (!bytes.ok()) return FallBack(ask, bytes.status());
                std::move(ask->done)(std::move(bytes));
              });
            });
      },
      priority == ReadPriority::kDemand ? WorkerPool::kUrgent : WorkerPool::kNormal);
}

void NodeHostTier::WatchHome(const std::shared_ptr<Ask>& ask, absl::Duration after) {
  timer_.RunAfter(after,
                  [this, ask, alive = alive_] { alive->RunIfAlive([&] { CheckHome(ask); }); });
}

void NodeHostTier::CheckHome(const std::shared_ptr<Ask>& ask) {
  if (ask->answered) return;
  // A home that answers other requests meanwhile is busy reading, not gone: the wait counts from
  // its last answer.
  const absl::Time last_answer = absl::FromUnixNanos(
      homes_state_.at(ask->home).last_answer_ns.load(std::memory_order_relaxed));
  const absl::Time quiet_since = std::max(ask->asked, last_answer);
  const absl::Duration quiet = absl::Now() - quiet_since;
  if (quiet < options_.home_timeout) return WatchHome(ask, options_.home_timeout - quiet);
  if (!ask->Claim()) return;
  Pause(ask->home);
  FallBack(ask, absl::DeadlineExceededError(absl::StrCat(
                    "it answered nothing for ", absl::FormatDuration(options_.home_timeout))));
}

void NodeHostTier::GiveBack(Home& home, absl::AnyInvocable<void() &&> release) {
  // On the home's thread: writing to a home that stopped reading may block, and this may be the
  // last reference to a session, which must not go on that session's own reader thread.
  home.worker->Post(std::move(release), WorkerPool::kUrgent);
}

absl::StatusOr<HostBytes> NodeHostTier::Accept(const std::shared_ptr<Ask>& ask, HomeLease lease) {
  absl::Status mismatch;
  const uint64_t size = ask->object.object->size;
  const std::optional<uint64_t> checksum = catalog_.Checksum(ask->key);
  if (lease.size != size) {
    mismatch = absl::FailedPreconditionError(absl::StrCat("it lent ", lease.size,
                                                          " bytes, this daemon's model has ", size,
                                                          " (is it registered from other files?)"));
  } else if (checksum.has_value() && lease.checksum != 0 && *checksum != lease.checksum) {
    mismatch = absl::FailedPreconditionError(
        "its checksum of the object differs from this daemon's (is the model registered from "
        "other files?)");
  }
  if (!mismatch.ok()) {
    GiveBack(homes_state_.at(ask->home), std::move(lease.release));
    return mismatch;
  }
  host_fetches_.fetch_add(1, std::memory_order_relaxed);
  bytes_from_homes_.fetch_add(lease.size, std::memory_order_relaxed);
  // Given back on the home's thread: the copy's completion callback must not wait on a write to a
  // home that stopped reading.
  Home* home = &homes_state_.at(ask->home);
  return HostBytes(
      lease.data, lease.size, *lease.arena,
      [this, home, release = std::move(lease.release)]() mutable {
        GiveBack(*home, std::move(release));
      },
      std::move(lease.compressed));
}

void NodeHostTier::Distrust(const std::string& key) {
  if (homes_.IsHomedHere(key) || local_.IsResident(key)) return local_.Distrust(key);
  TIERD_LOG_EVERY_N_SEC(WARNING, 10)
      << key << " from its home " << homes_.HomeOf(key) << " failed its check on the way here";
}

void NodeHostTier::FallBack(std::shared_ptr<Ask> ask, const absl::Status& why) {
  fallbacks_.fetch_add(1, std::memory_order_relaxed);
  TIERD_LOG_EVERY_N_SEC(WARNING, 10)
      << "reading " << ask->key << " here, not from its home " << ask->home << ": " << why;
  local_.Fetch(ask->key, ask->priority, ask->deadline, std::move(ask->done));
}

absl::Status NodeHostTier::Prefetch(const std::string& key, absl::Time deadline) {
  const std::string* home = HomeToAsk(key);
  if (home == nullptr) return local_.Prefetch(key, deadline);
  if (Paused(*home)) {
    fallbacks_.fetch_add(1, std::memory_order_relaxed);
    return local_.Prefetch(key, deadline);
  }
  homes_state_.at(*home).worker->Post(
      [this, home = *home, key] { peers_.PrefetchHost(home, key); });
  return absl::OkStatus();
}

bool NodeHostTier::Paused(const std::string& home) const {
  absl::MutexLock lock(&mu_);
  auto it = paused_until_.find(home);
  return it != paused_until_.end() && absl::Now() < it->second;
}

void NodeHostTier::Pause(const std::string& home) {
  absl::MutexLock lock(&mu_);
  paused_until_[home] = absl::Now() + options_.unresponsive_pause;
  TIERD_LOG(WARNING) << "home " << home << " lent nothing within "
                     << absl::FormatDuration(options_.home_timeout) << "; its objects are read "
                     << "here for the next " << absl::FormatDuration(options_.unresponsive_pause);
}

NodeHostStats NodeHostTier::stats(const HostLender* lender) const {
  NodeHostStats stats;
  if (lender != nullptr) {
    stats.leases_served = lender->leases_served();
    stats.leases_held = lender->leases_held();
    stats.leases_kept = lender->leases_quarantined();
    stats.lent_bytes = lender->bytes_lent();
  }
  stats.daemons = homes_.members().size();
  stats.host_fetches = host_fetches_.load(std::memory_order_relaxed);
  stats.bytes_from_homes = bytes_from_homes_.load(std::memory_order_relaxed);
  stats.fallbacks = fallbacks_.load(std::memory_order_relaxed);
  stats.peer_arena_bytes = peers_.RegisteredArenaBytes();
  for (const std::string& key : local_.cache().Keys("")) {
    if (homes_.IsHomedHere(key) && local_.IsResident(key) && catalog_.Lookup(key).ok()) {
      ++stats.objects_homed;
    }
  }
  return stats;
}

}  // namespace tierd
