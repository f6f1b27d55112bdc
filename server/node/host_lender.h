// The home's side of the node's host tier (docs/NODE.md): lends the node's other daemons model
// objects where they lie in this daemon's host arena (FetchRequest.host_lease), so that they copy
// them to their GPU from here instead of reading and pinning them a second time.
//
// HostLender is the daemon's: it reads objects into the host cache, counts what it lends, and keeps
// what sessions that ended were still lent. HostLeases is one session's table of what it was lent.
// A lent object is held (a HostObject reference: resident, never evicted or moved) until the
// borrower says its copies out of it are done — never for a while and then let go:
//  - the session that was lent it releases the lease;
//  - when that session ends first (its connection broke, not its daemon), the object is
//    quarantined: held for the borrower's process, which releases it on a later session once its
//    copies have completed (HostLeases::Release finds it by its id, lender-wide), or released when
//    that process has exited (watched through a pidfd: a process that is gone copies nothing);
//  - at the home's shutdown, once its host cache reads nothing more (HostCache::StopServing), so
//    that no range let go is written again before this process exits.
// Host leases are lent only on the session socket, where the kernel names the borrower's process
// (SO_PEERCRED); a gRPC session's request for one is refused.
//
// What may be lent is bounded: each session at most its staging quota in bytes
// (--session-max-staging-bytes) and its lease quota in leases — what its process's ended sessions
// left quarantined counted in, so that cycling sessions gains a process nothing — and all
// sessions together —
// quarantined leases included, each object counted once however many hold it — at most half the
// host cache, so that borrowers holding leases can never fill the cache the daemon's own clients
// need. Thread-safe.
#ifndef TIERD_SERVER_NODE_HOST_LENDER_H_
#define TIERD_SERVER_NODE_HOST_LENDER_H_

#include <sys/types.h>

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
#include "storage/host/host_arena.h"
#include "storage/host/host_cache.h"
#include "storage/model/catalog.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

struct HostLoan {
  uint64_t lease_id = 0;
  std::string key;
  uint64_t offset = 0;  // in the arena
  uint64_t length = 0;
  uint64_t checksum = 0;  // as recorded by the catalog; 0 when none is
  // The bytes at `offset` when the object is held compressed (its compressed form); 0: raw.
  uint64_t encoded_length = 0;
};

class HostLender {
 public:
  // The id of the arena's handle in a session (Handle.id of kind HOST_ARENA).
  static constexpr uint32_t kArenaHandleId = 1;
  // How often the processes that quarantined leases are waited for are checked.
  static constexpr absl::Duration kLesseeCheckPeriod = absl::Milliseconds(200);

  // All must outlive this. REQUIRES: the arena is shared (HostArena::shared_memory_name()).
  // `max_lent_bytes`: what all sessions together may hold (0: half the arena).
  HostLender(Catalog& catalog, HostCache& cache, const HostArena& arena,
             uint64_t max_lent_bytes = 0);
  // Releases what is still lent or quarantined. REQUIRES: the host cache is alive and serves no
  // more (HostCache::StopServing), so that nothing is read into the ranges let go.
  ~HostLender();
  HostLender(const HostLender&) = delete;
  HostLender& operator=(const HostLender&) = delete;

  // The arena's handle, as sessions send it once.
  v1::Handle ArenaHandle() const;
  uint64_t max_lent_bytes() const { return max_lent_bytes_; }

  uint64_t leases_served() const ABSL_LOCKS_EXCLUDED(mu_);
  // Leases held by sessions and quarantined for the processes of ended ones.
  uint64_t leases_held() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t leases_quarantined() const ABSL_LOCKS_EXCLUDED(mu_);
  // The host cache's bytes the leases (asked for, held or quarantined) hold, each object once.
  uint64_t bytes_lent() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class HostLeases;
  struct Quarantined {
    pid_t lessee = 0;
    HostObject object;
  };
  // A process that quarantined leases, watched until it exits.
  struct Lessee {
    int pidfd = -1;  // -1 where pidfd_open is missing: kill(pid, 0) says instead
    int leases = 0;
    uint64_t bytes = 0;
  };
  struct Held {
    uint64_t leases = 0;
    uint64_t bytes = 0;
  };
  // What process `lessee`'s ended sessions left quarantined.
  Held QuarantinedFor(pid_t lessee) const ABSL_LOCKS_EXCLUDED(mu_);

  // The size `key` would be lent at, checking it may be: NOT_FOUND for a stored object's key (only
  // model objects are homed) or an unknown one; FAILED_PRECONDITION when `source_fingerprint` (0:
  // unchecked) is not this daemon's ObjectSourceFingerprint of it.
  absl::StatusOr<uint64_t> SizeToLend(const std::string& key, uint64_t source_fingerprint) const;
  // Counts one more lease (asked for, held or quarantined) of `key`, whose `bytes` are taken from
  // what may be lent if no other lease holds it; RESOURCE_EXHAUSTED when that would pass
  // max_lent_bytes. Unreserve undoes it.
  absl::Status Reserve(const std::string& key, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void Unreserve(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  void UnreserveLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new lease's id (kIdBit set), unique for this lender's life.
  uint64_t NextLeaseId() ABSL_LOCKS_EXCLUDED(mu_);
  // Brings `key` into the host cache (at demand priority) for a loan.
  void Fetch(const std::string& key, absl::AnyInvocable<void(absl::StatusOr<HostObject>) &&> done);
  // A lease was made / given back by its session.
  void Lent() ABSL_LOCKS_EXCLUDED(mu_);
  void Returned(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Holds `leases` for process `lessee` until it releases them or exits.
  void Quarantine(pid_t lessee, std::map<uint64_t, HostObject> leases) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases quarantined lease `lease_id` of process `lessee`; false when it has none such.
  // REQUIRES: no lock of a HostLeases held (releasing an object may run host-cache callbacks).
  bool ReleaseQuarantined(uint64_t lease_id, pid_t lessee) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases what processes that have exited left quarantined; checks again later while any is.
  void CheckLessees() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes a quarantined lease out, with its bytes. REQUIRES: it is there.
  HostObject TakeQuarantinedLocked(std::map<uint64_t, Quarantined>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Catalog& catalog_;
  HostCache& cache_;
  const HostArena& arena_;
  const uint64_t max_lent_bytes_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t served_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;  // by sessions (quarantined ones are counted apart)
  // Every object leased (asked for, held or quarantined): its leases and its bytes, counted once in
  // bytes_.
  struct Loaned {
    int leases = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, Loaned> loaned_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Quarantined> quarantined_ ABSL_GUARDED_BY(mu_);  // by lease id
  std::map<pid_t, Lessee> lessees_ ABSL_GUARDED_BY(mu_);
  bool checking_ ABSL_GUARDED_BY(mu_) = false;  // a CheckLessees is scheduled
  uint32_t fetching_ ABSL_GUARDED_BY(mu_) = 0;  // host-cache fetches for lends under way
  TimerThread timer_;                           // last: goes first
};

class HostLeases : public std::enable_shared_from_this<HostLeases> {
 public:
  // Ids of host leases have this bit set, so that they never collide with the GPU tier's.
  static constexpr uint64_t kIdBit = 1ull << 63;
  static bool IsHostLease(uint64_t lease_id) { return (lease_id & kIdBit) != 0; }

  // At most `max_leases` leases and `max_bytes` bytes are held at once by the session, whose
  // client is process `lessee` (its session socket's peer). Made shared: a lend in flight keeps
  // it. `lender` must outlive every call but the destructor.
  HostLeases(HostLender& lender, uint32_t max_leases, uint64_t max_bytes, pid_t lessee)
      : lender_(lender), max_leases_(max_leases), max_bytes_(max_bytes), lessee_(lessee) {}
  // REQUIRES: ReleaseAll was called (the session ended); then it touches no lender.
  ~HostLeases() = default;
  HostLeases(const HostLeases&) = delete;
  HostLeases& operator=(const HostLeases&) = delete;

  // Lends `key` and records the lease. RESOURCE_EXHAUSTED when the session's lease or byte quota,
  // or what all sessions may be lent, would be passed; UNAVAILABLE once ReleaseAll has run (the
  // session ended while the read was under way); HostLender's errors of SizeToLend; the host
  // cache's.
  void Lend(const std::string& key, uint64_t source_fingerprint,
            absl::AnyInvocable<void(absl::StatusOr<HostLoan>) &&> done) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases a lease this session holds, or one an earlier session of the same process left
  // quarantined. NOT_FOUND for any other.
  absl::Status Release(uint64_t lease_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The session ended: refuses new leases, and quarantines what is still held for the session's
  // process (see HostLender). Returns how many were held.
  size_t ReleaseAll() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  HostLender& lender_;
  const uint32_t max_leases_;
  const uint64_t max_bytes_;
  const pid_t lessee_;
  absl::Mutex mu_;
  std::map<uint64_t, HostObject> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;    // of leases_ and of the lends pending
  uint32_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // lends asked, not answered
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tierd

#endif  // TIERD_SERVER_NODE_HOST_LENDER_H_
