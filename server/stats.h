// One snapshot of the daemon's tiers and counters, as GetStats answers it and the metrics endpoint
// exposes it.
#ifndef TIERD_SERVER_STATS_H_
#define TIERD_SERVER_STATS_H_

#include <string>
#include <vector>

#include "gpu/gpu_tier.h"
#include "storage/catalog.h"
#include "storage/host_cache.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

// A client group's GPU tier (server/client_groups.h).
struct NamedGpuTier {
  std::string name;
  GpuTier* tier = nullptr;
};

// Takes each tier's lock in turn (not all at once): the figures of different tiers may be a few
// microseconds apart. `gpu_tier` is the default group's tier, `client_groups` the others' (their
// figures are summed in, and each is listed when there are any). `device` is Device::Describe().
v1::Stats CollectStats(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
                       const std::vector<NamedGpuTier>& client_groups, const std::string& device);

}  // namespace tierd

#endif  // TIERD_SERVER_STATS_H_
