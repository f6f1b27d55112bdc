// What the parts of one GpuTier share: its one lock and the pieces every part works with. GpuTier
// owns them all, builds one TierParts and hands it by reference to each part it makes (the staging
// loader, the peer loader, the commit pipeline, the handoff copies, the explicit evictions); each
// part's constructor takes what is its own beside it. Tests wire the parts the same way
// (tests/gpu_parts_test_support.h).
//
// One lock for all the parts, not one each (gpu/gpu_tier.h says why): a staging object is listed
// by the residency, leased and pinned by clients, freed by drains and published by commits, and
// whether it may be evicted or freed depends on all of them at once.
//
// Internal to the GPU tier.
#ifndef TIERD_GPU_DETAIL_TIER_PARTS_H_
#define TIERD_GPU_DETAIL_TIER_PARTS_H_

#include "absl/synchronization/mutex.h"
#include "device/device.h"
#include "gpu/chunked_copier.h"
#include "gpu/detail/running_callbacks.h"
#include "gpu/detail/staging_residency.h"
#include "gpu/event_pool.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/staging_pool.h"
#include "storage/model/catalog.h"

namespace tierd {

// All references must outlive every part made with them. `mu` guards the parts' state, `stats`
// and `residency`.
struct TierParts {
  absl::Mutex& mu;
  Device& device;
  const Catalog& catalog;
  StagingPool& pool;
  EventPool& events;
  ChunkedCopier& copier;
  StagingResidency& residency;
  RunningCallbacks& callbacks;
  GpuTierStats& stats;
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_TIER_PARTS_H_
