// One object of the GPU tier: its bytes' place in staging, its state on the way there, and who
// holds or waits for it. The residency (staging_residency.h) keeps the objects in a
// ResidencyTable (common/residency.h), which owns them, lists them by key and frees them; client
// leases (the entry's refs), pins and drains point at them, which is why all of them are under
// the tier's one lock. Internal to the GPU tier.
#ifndef TIERD_GPU_DETAIL_STAGING_OBJECT_H_
#define TIERD_GPU_DETAIL_STAGING_OBJECT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/residency.h"
#include "gpu/detail/landed_copies.h"
#include "gpu/gpu_tier_types.h"
#include "gpu/staging_pool.h"
#include "storage/model/catalog.h"

namespace tierd {

// The GPU tier's own state of an object; the table's entry adds its key, whether it is listed,
// its leases (refs), pins and staging range (memory).
struct StagingObjectRecord {
  enum class State {
    kFetchingHost,  // waiting for the host tier
    kFetchingPeer,  // waiting for a peer daemon to lend it (unlisted: see GpuTier::Fetch)
    kAllocating,    // has the host bytes, waiting for staging room
    // The copy into staging is enqueued without a ready event (none was free): readable, and
    // its waiters answered, once the copy completes.
    kCopying,
    kResident,  // the copy into staging is done, or enqueued with the ready event recorded after it
  };
  struct Waiter {
    ClientId client = 0;
    GpuLeaseCallback lease;     // a fetch, or
    GpuStatusCallback pin;      // a pin (the pin itself is already counted)
    bool through_host = false;  // the fetch's FetchOptions::through_host
  };

  uint64_t size = 0;
  Tensors tensors;
  std::shared_ptr<const ModelInfo> model;  // weights: the registration the bytes belong to
  // A shard copied out of its whole object's host bytes (ObjectInfo::from_base), of
  // `cut_from_size` bytes, rather than read as itself (storage/model/shard.h, CutShardFromObject);
  // null otherwise.
  std::shared_ptr<const ObjectInfo> cut;
  uint64_t cut_from_size = 0;
  absl::Time deadline = absl::InfiniteFuture();  // the load's first host fetch's
  State state = State::kFetchingHost;
  // Recorded after the copy into staging; held while that copy may run, and while a lease granted
  // then (which names it) is held: StagingResidency::DropReadyEventIfUnneeded gives it back.
  std::optional<uint32_t> ready_event;
  uint32_t ready_event_leases = 0;  // leases held that name ready_event
  bool copying = false;             // a copy into or out of the range has not completed
  bool demand = false;
  int host_fetches = 0;  // host fetches not answered yet
  // Its bytes copied on as they land while its first host fetch reads them (landed_copies.h);
  // null when not asked for, and once CopyIn or FailLoad has closed them. Once started they hold
  // `memory` and count as a copy in flight.
  std::shared_ptr<LandedCopies> landed;
  std::vector<Waiter> waiters;
  // When its last lease ended (InfinitePast: never leased): how long a retained set has been idle
  // (gpu/retained_sets.h).
  absl::Time last_released = absl::InfinitePast();
};

using StagingObjectTable = ResidencyTable<StagingObjectRecord, StagingAllocation>;
using StagingObject = StagingObjectTable::Entry;

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_STAGING_OBJECT_H_
