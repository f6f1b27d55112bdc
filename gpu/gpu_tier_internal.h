// The records GpuTier keeps, shared by its source files. Internal to gpu_tier*.cc.
#ifndef TIERD_GPU_GPU_TIER_INTERNAL_H_
#define TIERD_GPU_GPU_TIER_INTERNAL_H_

#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpu/gpu_tier.h"

namespace tierd {

struct GpuTier::Object {
  enum class State {
    kFetchingHost,  // waiting for the host tier
    kFetchingPeer,  // waiting for a peer daemon to lend it (unlisted: see GpuTier::Fetch)
    kAllocating,    // has the host bytes, waiting for staging room
    kResident,      // the copy into staging is enqueued (or done) and the ready event recorded
  };
  struct Waiter {
    ClientId client = 0;
    LeaseCallback lease;        // a fetch, or
    StatusCallback pin;         // a pin (the pin itself is already counted)
    bool through_host = false;  // the fetch's FetchOptions::through_host
  };

  std::string key;
  uint64_t size = 0;
  Tensors tensors;
  std::shared_ptr<const ModelInfo> model;  // weights: the registration the bytes belong to
  State state = State::kFetchingHost;
  bool listed = false;
  std::optional<StagingRange> range;
  std::optional<uint32_t> ready_event;
  bool copying = false;  // a copy into or out of the range has not completed
  int leases = 0;        // held and draining
  int pins = 0;
  bool demand = false;
  int host_fetches = 0;  // host fetches not answered yet
  std::vector<Waiter> waiters;
  std::list<Object*>::iterator lru_position;
  bool in_lru = false;
};

struct GpuTier::Client {
  struct Lease {
    Object* object = nullptr;
    uint32_t done_event = 0;
    std::optional<uint64_t> host_offset;  // its range in the host handoff buffer
  };
  struct Reservation {
    std::string key;
    StagingRange range;
    uint64_t length = 0;
    uint32_t written_event = 0;
    Tensors tensors;
    StorePolicy policy;
  };
  struct PinRecord {
    Object* object = nullptr;
    int count = 0;
  };

  ClientId id = 0;
  ClientLimits limits;
  std::shared_ptr<Stream> drain_stream;
  std::map<uint64_t, Lease> leases;
  uint64_t next_lease = 1;
  std::map<uint64_t, Reservation> reservations;
  uint64_t next_reservation = 1;
  std::map<std::string, PinRecord> pins;
  uint32_t pending_fetches = 0;
  uint64_t staging_bytes = 0;
  std::set<uint64_t> drains;
  bool closed = false;
};

// Work that waits for a client's event on the client's drain stream.
struct GpuTier::Drain {
  enum class Kind {
    kLease,   // a released lease: `object` may be reused once the done event completes
    kRange,   // an abandoned reservation: `range` is free once the written event completes
    kCommit,  // a commit: the copy to the host tier starts once the written event completes
  };
  Kind kind = Kind::kLease;
  ClientId client = 0;
  uint32_t event = 0;  // handed out again once the drain completes
  Object* object = nullptr;
  std::optional<StagingRange> range;
  uint64_t commit = 0;
  std::optional<uint64_t> host_offset;  // kLease: its range in the host handoff buffer
};

struct GpuTier::AllocationWaiter {
  uint64_t bytes = 0;
  absl::AnyInvocable<void(absl::StatusOr<StagingRange>) &&> done;
};

// Drain callbacks run on client drain streams, which a forced close may leave waiting forever on
// CUDA; they find the tier through this, and the tier clears it when it goes.
struct GpuTier::Liveness {
  absl::Mutex mu;
  GpuTier* tier ABSL_GUARDED_BY(mu) = nullptr;
};

// A commit between its request and the object reaching the host tier. Two things must happen
// before the copy out of staging starts: the client's written event completes, and the host tier
// reserves room.
struct GpuTier::PendingCommit {
  Client::Reservation reservation;
  StatusCallback done;
  bool written = false;
  std::shared_ptr<HostObject> host;  // set once reserved
  absl::Status host_status;          // the host tier's refusal
};

absl::Status ClientGone();
// RESOURCE_EXHAUSTED: an object of `bytes` cannot fit in a staging slab of `slab_bytes`.
absl::Status LargerThanSlab(const std::string& key, uint64_t bytes, uint64_t slab_bytes);
// Checks that a client holding `held` staging bytes may take `bytes` more for `key`.
absl::Status CheckStagingQuota(const ClientLimits& limits, uint64_t held, const std::string& key,
                               uint64_t bytes);

}  // namespace tierd

#endif  // TIERD_GPU_GPU_TIER_INTERNAL_H_
