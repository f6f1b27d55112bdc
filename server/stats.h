// One snapshot of the daemon's tiers and counters, as GetStats answers it and the metrics endpoint
// exposes it.
#ifndef TIERD_SERVER_STATS_H_
#define TIERD_SERVER_STATS_H_

#include <string>

#include "server/gpu_tier.h"
#include "storage/catalog.h"
#include "storage/host_cache.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

// Takes each tier's lock in turn (not all at once): the figures of different tiers may be a few
// microseconds apart. `device` is Device::Describe().
v1::Stats CollectStats(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
                       const std::string& device);

}  // namespace tierd

#endif  // TIERD_SERVER_STATS_H_
