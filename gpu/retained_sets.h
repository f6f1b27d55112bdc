// A GPU tier's retained sets: objects kept in the tier's staging memory beyond the sessions that
// use them, so that a restarted, scaled-out or woken model server finds its weights already on the
// GPU and leases them without a copy.
//
// A set is named by its target, which says what it holds:
//   "MODEL"         every object of a registered model (at the time it is retained);
//   "NAMESPACE/"    every stored object of this tier under the prefix (at the time it is retained);
//   "NAMESPACE/KEY" one object.
// A retained set's objects are pinned by a client of the tier's own (no done events, no session),
// so nothing evicts them; they are leased like any other object. A set is kept
//   - until it is released (Release), or
//   - until its time to live has passed since its last lease ended (0: no time to live), or
//   - while it sleeps: Sleep gives its staging back to the pool (its objects stay in the host tier,
//     subject to its eviction order, and come back from disk or the durable store otherwise);
//     Wake brings them back, each to the range it had where that range is free again, so that
//     device addresses a client kept (a captured CUDA graph's) hold the same bytes once it leases
//     them again. Sleep refuses a set while any of its objects is leased: it never takes memory
//     from under a reader.
// The bytes of the sets that are awake count against the budget (GpuTierOptions::
// retained_budget_bytes); one more is refused RESOURCE_EXHAUSTED before anything is loaded. A set
// is retained all or nothing: when one of its objects cannot be had, those loaded are let go.
// Each tier (a client group's) has its own sets: no other group can see, lease, sleep or release
// them. Sets are recorded in a file (GpuTierOptions::retained_state_file) and retained again by
// Restore after a restart, from the host tier, disk or durable store; their idle time starts again.
//
// Answers run on the thread that completes the work (never under this class's lock). Thread-safe.
#ifndef TIERD_GPU_RETAINED_SETS_H_
#define TIERD_GPU_RETAINED_SETS_H_

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/figures.h"
#include "common/liveness.h"
#include "common/periodic_thread.h"
#include "gpu/gpu_tier_types.h"
#include "gpu/staging_pool.h"
#include "storage/model/catalog.h"

namespace tierd {

class GpuTier;

struct RetainedSetInfo {
  std::string target;
  uint64_t objects = 0;
  uint64_t bytes = 0;  // the staging its objects take, each rounded up to kStagingAlignment
  absl::Duration ttl = absl::ZeroDuration();
  bool asleep = false;
  // How long since the last lease of one of its objects ended (or it was retained or woken).
  absl::Duration idle = absl::ZeroDuration();
  // Of its objects, those the last wake could not put back where they were before its sleep.
  uint64_t moved = 0;
};

struct RetainedSetsStats {
  uint64_t sets = 0;
  uint64_t asleep = 0;
  uint64_t bytes = 0;  // of the sets awake: what counts against the budget
  uint64_t budget_bytes = 0;
  uint64_t expired = 0;  // sets released because their time to live passed
};

inline constexpr Figure<RetainedSetsStats> kRetainedSetsFigures[] = {
    {"retained_sets", &RetainedSetsStats::sets},
    {"retained_sets_asleep", &RetainedSetsStats::asleep},
    {"retained_bytes", &RetainedSetsStats::bytes},
    {"retain_budget_bytes", &RetainedSetsStats::budget_bytes},
    {"retained_sets_expired", &RetainedSetsStats::expired},
};
static_assert(std::size(kRetainedSetsFigures) * sizeof(uint64_t) == sizeof(RetainedSetsStats),
              "every member of RetainedSetsStats has its line in kRetainedSetsFigures");

class RetainedSets {
 public:
  // Sets one tier may have, asleep or awake: each is a line of the state file and is checked every
  // second, so a client of many tiny objects cannot grow them without bound.
  static constexpr size_t kMaxSets = 4096;
  // The longest time to live a set may have.
  static constexpr absl::Duration kMaxTtl = absl::Hours(24 * 366);

  struct Options {
    uint64_t budget_bytes = 0;
    std::string state_file;  // empty: sets are not recorded
    // How often objects of a sleeping set whose copies were in flight are evicted again; time to
    // live and changed objects are checked every second.
    absl::Duration sweep_period = absl::Milliseconds(20);
  };
  using Answer = absl::AnyInvocable<void(absl::StatusOr<RetainedSetInfo>) &&>;

  // Opens the tier's client that holds the pins. `tier` and `catalog` must outlive this.
  static absl::StatusOr<std::unique_ptr<RetainedSets>> Create(GpuTier& tier,
                                                              const Catalog& catalog,
                                                              Options options);
  // Stops the sweeps, answers what still waits UNAVAILABLE and closes the client (the sets'
  // objects become evictable).
  ~RetainedSets();
  RetainedSets(const RetainedSets&) = delete;
  RetainedSets& operator=(const RetainedSets&) = delete;

  // Retains `target` (see the header comment), answering once all of its objects are on the GPU.
  // A target already retained keeps its objects, takes the new `ttl` and is answered once they
  // are resident. Errors: INVALID_ARGUMENT (a malformed target), NOT_FOUND (nothing by that
  // name), RESOURCE_EXHAUSTED (past the budget or kMaxSets, or the pool is full), FAILED_PRECONDITION (the set
  // sleeps: wake it; a model whose files changed), the loads' errors.
  void Retain(const std::string& target, absl::Duration ttl, Answer done) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `target`: its objects become evictable (leases held keep theirs). NOT_FOUND when it is
  // not retained; FAILED_PRECONDITION while it is being retained, slept or woken.
  absl::Status Release(const std::string& target) ABSL_LOCKS_EXCLUDED(mu_);
  // Puts `target` to sleep, answering once its staging is back in the pool (an object whose copy
  // into staging is still in flight leaves once it completes). FAILED_PRECONDITION while one of
  // its objects is leased (naming it), or when it is not awake. An object a process leases
  // between that check and the eviction stays until released, then goes in the pool's eviction
  // order like any object nobody holds; so does one another set or a session pins.
  void Sleep(const std::string& target, Answer done) ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes `target`, answering once its objects are back on the GPU (with how many moved). Errors
  // as Retain's; on error the set stays asleep.
  void Wake(const std::string& target, Answer done) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<RetainedSetInfo> List() const ABSL_LOCKS_EXCLUDED(mu_);
  RetainedSetsStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // Retains again (or keeps asleep) what the state file records, in the background; a set that
  // cannot be had any more is logged and forgotten. Call once, after the tier's stored objects
  // have been adopted.
  void Restore() ABSL_LOCKS_EXCLUDED(mu_);
  // Evicts what sleeping sets left on the GPU and answers their sleeps once none is left; once a
  // second, releases the sets whose time to live has passed by `now` or whose objects changed.
  // Called every sweep period.
  void Sweep(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kLoading, kAwake, kAsleep };
  struct Set {
    std::vector<std::string> keys;
    uint64_t bytes = 0;
    absl::Duration ttl;
    State state = State::kLoading;
    absl::Time since;  // retained, woken or put to sleep
    std::map<std::string, StagingRange> placements;  // while asleep: where each object was
    uint64_t moved = 0;
    std::vector<Answer> waiting;  // answered when the load ends
    // While falling asleep: objects whose copies were in flight, evicted once those complete,
    // and the sleeps answered then.
    std::vector<std::string> leaving;
    std::vector<Answer> sleeping;
    RetainedSetInfo slept;  // what the sleeps are answered with
  };

  RetainedSets(GpuTier& tier, const Catalog& catalog, Options options, ClientId client);
  // The keys `target` names and their sizes, summed.
  absl::Status Expand(const std::string& target, std::vector<std::string>& keys,
                      uint64_t& bytes) const;
  // Pins every key, then calls `done` with the first error (having unpinned the rest) or OK.
  void PinAll(std::vector<std::string> keys, absl::AnyInvocable<void(absl::Status) &&> done);
  // A load of `target` ended: it is awake, or back where it was (`failed_state`) on error.
  void LoadEnded(const std::string& target, State failed_state, absl::Status status)
      ABSL_LOCKS_EXCLUDED(mu_);
  RetainedSetInfo InfoLocked(const std::string& target, const Set& set, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BudgetAllowsLocked(const std::string& target, uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rewrites the state file (logging a failure: the sets stay as they are in memory).
  void RecordLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnpinKeys(const std::vector<std::string>& keys);
  // Evicts each of `keys` from the GPU; returns those that must be tried again (their copy was
  // still in flight).
  std::vector<std::string> EvictFromGpu(const std::vector<std::string>& keys);
  // Releases the sets whose time to live passed or whose objects changed; returns the keys to
  // unpin.
  std::vector<std::string> ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  GpuTier& tier_;
  const Catalog& catalog_;
  const Options options_;
  const ClientId client_;
  mutable absl::Mutex mu_;
  std::map<std::string, Set> sets_ ABSL_GUARDED_BY(mu_);
  uint64_t committed_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of sets loading or awake
  uint64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_expiry_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Loads' answers (PinAll) run only while this lives.
  const std::shared_ptr<Liveness> liveness_ = std::make_shared<Liveness>();
  std::unique_ptr<PeriodicThread> sweeper_;  // last: started once the rest is built
};

// Checks a target's form (non-empty, at most 1024 bytes, no control characters). INVALID_ARGUMENT
// naming `field` otherwise.
absl::Status CheckRetainTarget(const std::string& target, const std::string& field);

}  // namespace tierd

#endif  // TIERD_GPU_RETAINED_SETS_H_
