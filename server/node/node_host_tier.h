// The node's host tier, as one daemon sees it (docs/NODE.md): the daemons named in --peers share
// one host tier. Each model object has one home (NodeHomes); only the home reads it from disk and
// keeps it in its host cache. This daemon's GPU tiers load a model object homed elsewhere by
// borrowing it from the home's host arena (a host lease, PeerDaemons::BorrowHost) and copying it
// to the GPU from there; the lease is given back once that copy has completed. No second disk
// read, no second pinned copy.
//
// When the home cannot lend — it is down, refuses (it does not know the model, its cache is
// full, its files differ), answers nothing at all for `home_timeout` (a home busy reading answers
// other borrows meanwhile, and is waited for), or lends bytes that do not match this daemon's
// record of the object — this daemon reads the object itself, into its own host cache: logged
// (at most once per 10 s) and counted (fallbacks). A home that timed out is not asked again for
// `unresponsive_pause`. Stored objects, and objects homed here, come from the own host cache.
// Prefetches of objects homed elsewhere become host-only prefetches at their home.
//
// Talking to a peer can block (connecting, or writing to a peer that stopped reading), so each
// peer has a thread of its own for it; a fetch never waits for a home that has been silent for
// `home_timeout`.
// From the start, each peer is connected to (again every second until it answers), so that its
// host arena is mapped and registered here before the first load needs it.
// Thread-safe.
#ifndef TIERD_SERVER_NODE_NODE_HOST_TIER_H_
#define TIERD_SERVER_NODE_NODE_HOST_TIER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/figures.h"
#include "common/liveness.h"
#include "common/timer_thread.h"
#include "common/worker_pool.h"
#include "gpu/host_source.h"
#include "server/node/host_lender.h"
#include "server/node/node_homes.h"
#include "server/node/peer_daemons.h"
#include "storage/model/catalog.h"

namespace tierd {

struct NodeHostTierOptions {
  // How long a home may answer nothing while a fetch waits for its lease before the object is
  // read here.
  absl::Duration home_timeout = absl::Seconds(30);
  // How long a home that did not answer in time is passed over.
  absl::Duration unresponsive_pause = absl::Seconds(10);
};

struct NodeHostStats {
  uint64_t daemons = 0;        // of the node, this one included
  uint64_t objects_homed = 0;  // model objects in this daemon's host cache homed here
  uint64_t host_fetches = 0;   // objects borrowed from their homes
  uint64_t bytes_from_homes = 0;
  uint64_t fallbacks = 0;  // objects read here although homed elsewhere
  // This daemon as a home (HostLender): host leases lent to the peers, and held by them now.
  uint64_t leases_served = 0;
  uint64_t leases_held = 0;
  uint64_t leases_kept = 0;  // of leases_held, kept for processes whose sessions ended
  uint64_t lent_bytes = 0;   // of the host cache, each object once
  // Bytes of the peers' host arenas registered here (PeerDaemons::RegisteredArenaBytes).
  uint64_t peer_arena_bytes = 0;
};

// How each figure is reported (common/figures.h).
inline constexpr Figure<NodeHostStats> kNodeHostFigures[] = {
    {"node_daemons", &NodeHostStats::daemons},
    {"node_objects_homed", &NodeHostStats::objects_homed},
    {"node_host_fetches", &NodeHostStats::host_fetches},
    {"bytes_node_host_to_gpu", &NodeHostStats::bytes_from_homes},
    {"node_fallbacks", &NodeHostStats::fallbacks},
    {"node_host_leases_served", &NodeHostStats::leases_served},
    {"node_host_leases", &NodeHostStats::leases_held},
    {"node_host_leases_kept", &NodeHostStats::leases_kept},
    {"node_host_lent_bytes", &NodeHostStats::lent_bytes},
    {"node_peer_arena_bytes", &NodeHostStats::peer_arena_bytes},
};
static_assert(std::size(kNodeHostFigures) * sizeof(uint64_t) == sizeof(NodeHostStats),
              "every member of NodeHostStats has its line in kNodeHostFigures");

class NodeHostTier : public HostSource {
 public:
  // All must outlive this; `local` is this daemon's own host cache and arena.
  NodeHostTier(const Catalog& catalog, LocalHostSource& local, PeerDaemons& peers, NodeHomes homes,
               const NodeHostTierOptions& options);
  // REQUIRES: no fetch is in flight (the GPU tiers that use it are gone). Joins the peers'
  // threads.
  ~NodeHostTier() override;
  NodeHostTier(const NodeHostTier&) = delete;
  NodeHostTier& operator=(const NodeHostTier&) = delete;

  // `landed` is told where the object comes from this daemon's own host cache without a home
  // asked first (homed here, read here already, or a stored object); a fallback after a home
  // failed to answer does not tell.
  void Fetch(const std::string& key, ReadPriority priority, absl::Time deadline, Callback done,
             HostCache::LandedCallback landed = nullptr) override;
  absl::Status Prefetch(const std::string& key, absl::Time deadline) override;
  // Resident in this daemon's own host cache (what a home holds is not known here).
  bool IsResident(const std::string& key) const override { return local_.IsResident(key); }
  // Drops this daemon's own copy; a home's copy is its home's to check (it is read the same way
  // by every daemon of the node).
  void Distrust(const std::string& key) override;

  const NodeHomes& homes() const { return homes_; }
  // With `lender`'s figures (this daemon as a home) when it is not null.
  NodeHostStats stats(const HostLender* lender) const;

 private:
  struct Ask;
  // Where `key` comes from: the own cache (nullptr) or the home at this socket; then `object`
  // (when not null) is this daemon's registration of it.
  const std::string* HomeToAsk(const std::string& key, ObjectRef* object = nullptr) const;
  // The object's bytes as the home lent them, once checked against the catalog; or why not.
  absl::StatusOr<HostBytes> Accept(const std::shared_ptr<Ask>& ask, HomeLease lease);
  // Reads the object here after all, saying why. REQUIRES: `ask` claimed by the caller.
  void FallBack(std::shared_ptr<Ask> ask, const absl::Status& why);
  struct Home;
  // Falls back for `ask` once its home has answered nothing (this or any other borrow) for
  // home_timeout; checks again `after` from now (CheckHome).
  void WatchHome(const std::shared_ptr<Ask>& ask, absl::Duration after);
  void CheckHome(const std::shared_ptr<Ask>& ask);
  // Gives a lease back on the home's thread.
  void GiveBack(Home& home, absl::AnyInvocable<void() &&> release);
  // Connects to `peer` on its thread, and tries again a second later until it answers.
  void ConnectAhead(const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);
  bool Paused(const std::string& home) const ABSL_LOCKS_EXCLUDED(mu_);
  void Pause(const std::string& home) ABSL_LOCKS_EXCLUDED(mu_);

  const Catalog& catalog_;
  LocalHostSource& local_;
  PeerDaemons& peers_;
  const NodeHomes homes_;
  const NodeHostTierOptions options_;

  std::atomic<uint64_t> host_fetches_{0};
  std::atomic<uint64_t> bytes_from_homes_{0};
  std::atomic<uint64_t> fallbacks_{0};

  // Answers from homes and timer calls run through it: they may come after this is gone.
  const std::shared_ptr<Liveness> alive_ = std::make_shared<Liveness>();
  mutable absl::Mutex mu_;
  std::map<std::string, absl::Time> paused_until_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // set first by the destructor: no more connects
  TimerThread timer_;
  // Each peer (by socket), created with this.
  struct Home {
    std::unique_ptr<WorkerPool> worker;      // one thread; the destructor joins them first
    std::atomic<int64_t> last_answer_ns{0};  // when it last answered a borrow (Unix ns)
  };
  std::map<std::string, Home> homes_state_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_NODE_NODE_HOST_TIER_H_
