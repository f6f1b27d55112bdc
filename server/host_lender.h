// The home's side of the node's host tier (docs/NODE.md): lends the node's other daemons model
// objects where they lie in this daemon's host arena (FetchRequest.host_lease), so that they copy
// them to their GPU from here instead of reading and pinning them a second time.
//
// HostLender is the daemon's: it reads objects into the host cache and counts what it lends.
// HostLeases is one session's table of what it was lent: a lent object is held (a HostObject
// reference: resident, never evicted or moved) until the session releases the lease, or for
// kClosedSessionGrace after the session ends without releasing it — its daemon's copies out of
// the object may still be running when its session breaks. Both are thread-safe.
#ifndef TIERD_SERVER_HOST_LENDER_H_
#define TIERD_SERVER_HOST_LENDER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/timer_thread.h"
#include "storage/catalog.h"
#include "storage/host_arena.h"
#include "storage/host_cache.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

struct HostLoan {
  uint64_t lease_id = 0;
  std::string key;
  uint64_t offset = 0;    // in the arena
  uint64_t length = 0;
  uint64_t checksum = 0;  // as recorded by the catalog; 0 when none is
};

class HostLender {
 public:
  // The id of the arena's handle in a session (Handle.id of kind HOST_ARENA).
  static constexpr uint32_t kArenaHandleId = 1;
  // How long the objects a session still held when it ended stay held.
  static constexpr absl::Duration kClosedSessionGrace = absl::Seconds(5);

  // All must outlive this. REQUIRES: the arena is shared (HostArena::shared_memory_name()).
  HostLender(Catalog& catalog, HostCache& cache, const HostArena& arena);
  // Releases at once what ended sessions left held. REQUIRES: the host cache is still alive.
  ~HostLender();
  HostLender(const HostLender&) = delete;
  HostLender& operator=(const HostLender&) = delete;

  // Brings model object `key` into the host cache (read from disk at demand priority when it is
  // not there) and calls `done` with a reference to it. NOT_FOUND for a stored object's key (only
  // model objects are homed) or an unknown one; FAILED_PRECONDITION when `source_fingerprint` (0:
  // unchecked) is not this daemon's ObjectSourceFingerprint of it; the host cache's errors.
  void Lend(const std::string& key, uint64_t source_fingerprint,
            absl::AnyInvocable<void(absl::StatusOr<HostObject>) &&> done);
  // The arena's handle, as sessions send it once.
  v1::Handle ArenaHandle() const;
  uint64_t OffsetOf(const HostObject& object) const {
    return static_cast<uint64_t>(object.data() - arena_.base());
  }
  std::optional<uint64_t> Checksum(const std::string& key) const { return catalog_.Checksum(key); }

  uint64_t leases_served() const { return counts_->served.load(std::memory_order_relaxed); }
  uint64_t leases_held() const {
    return static_cast<uint64_t>(counts_->held.load(std::memory_order_relaxed));
  }

 private:
  friend class HostLeases;
  // Shared with the sessions' tables, which may go after the lender (a read finishing as the host
  // cache stops).
  struct Counts {
    std::atomic<uint64_t> served{0};
    std::atomic<int64_t> held{0};
  };
  // Holds `objects` for kClosedSessionGrace, then releases them.
  void ReleaseAfterGrace(std::vector<HostObject> objects);

  Catalog& catalog_;
  HostCache& cache_;
  const HostArena& arena_;
  const std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
  TimerThread grace_;  // last: goes first, releasing what it holds
};

class HostLeases : public std::enable_shared_from_this<HostLeases> {
 public:
  // Ids of host leases have this bit set, so that they never collide with the GPU tier's.
  static constexpr uint64_t kIdBit = 1ull << 63;
  static bool IsHostLease(uint64_t lease_id) { return (lease_id & kIdBit) != 0; }

  // At most `max_leases` are held at once. Made shared: a lend in flight keeps it. `lender` must
  // outlive every call but the destructor.
  HostLeases(HostLender& lender, uint32_t max_leases)
      : lender_(lender), counts_(lender.counts_), max_(max_leases) {}
  // REQUIRES: ReleaseAll was called (the session ended); then it touches no lender.
  ~HostLeases() = default;
  HostLeases(const HostLeases&) = delete;
  HostLeases& operator=(const HostLeases&) = delete;

  // Lends `key` (HostLender::Lend) and records the lease. RESOURCE_EXHAUSTED when max_leases are
  // held; UNAVAILABLE once ReleaseAll has run (the session ended while the read was under way).
  void Lend(const std::string& key, uint64_t source_fingerprint,
            absl::AnyInvocable<void(absl::StatusOr<HostLoan>) &&> done) ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND for a lease this session does not hold.
  absl::Status Release(uint64_t lease_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The session ended: refuses new leases, and hands what is still held to the lender to release
  // after kClosedSessionGrace. Returns how many were held.
  size_t ReleaseAll() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  HostLender& lender_;
  const std::shared_ptr<HostLender::Counts> counts_;
  const uint32_t max_;
  absl::Mutex mu_;
  std::map<uint64_t, HostObject> leases_ ABSL_GUARDED_BY(mu_);
  uint32_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // lends asked, not answered
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = kIdBit | 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tierd

#endif  // TIERD_SERVER_HOST_LENDER_H_
