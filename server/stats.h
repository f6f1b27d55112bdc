// One snapshot of the daemon's tiers and counters, as GetStats answers it and the metrics endpoint
// exposes it.
#ifndef TIERD_SERVER_STATS_H_
#define TIERD_SERVER_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "gpu/gpu_tier.h"
#include "server/node/host_lender.h"
#include "server/node/node_host_tier.h"
#include "storage/host/host_cache.h"
#include "storage/model/catalog.h"
#include "tierd/v1/tierd.pb.h"

namespace tierd {

// A client group's GPU tier (server/client_groups.h).
struct NamedGpuTier {
  std::string name;
  GpuTier* tier = nullptr;
};

// The node's host tier as this daemon takes part in it (server/node/node_host_tier.h); null parts
// without one.
struct NodeParts {
  const NodeHostTier* tier = nullptr;
  const HostLender* lender = nullptr;
};

// Takes each tier's lock in turn (not all at once): the figures of different tiers may be a few
// microseconds apart. `gpu_tier` is the default group's tier, `client_groups` the others' (their
// figures are summed in, and each is listed when there are any). `device` is Device::Describe().
v1::Stats CollectStats(Catalog& catalog, HostCache& host_cache, GpuTier& gpu_tier,
                       const std::vector<NamedGpuTier>& client_groups, const std::string& device,
                       const NodeParts& node = {});

// Sets the uint64 field at `path` ("gpu.hits": the hits of the field gpu) of `message`; false when
// it has no such field.
bool SetFigure(google::protobuf::Message& message, absl::string_view path, uint64_t value);

// The paths of Stats that CollectStats fills: every figure table's, and those it sets by hand.
std::vector<std::string> ReportedFigures();

}  // namespace tierd

#endif  // TIERD_SERVER_STATS_H_
