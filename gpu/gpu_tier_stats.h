// What a GPU tier counts: GpuTier::stats(), summed over client groups by server/stats.cc.
#ifndef TIERD_GPU_GPU_TIER_STATS_H_
#define TIERD_GPU_GPU_TIER_STATS_H_

#include <cstdint>

namespace tierd {

struct GpuTierStats {
  uint64_t budget_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t bytes_host_to_gpu = 0;
  uint64_t bytes_gpu_to_host = 0;
  uint64_t peer_fetches = 0;  // fetches answered with a copy of a peer's object
  uint64_t bytes_peer_to_gpu = 0;
  uint64_t peer_fetches_through_host = 0;
  uint64_t copies_in_flight = 0;
  uint64_t allocation_waiters = 0;  // requests waiting for staging room that releases will free
  uint64_t clients = 0;
  uint64_t leases = 0;  // held and draining
  uint64_t reservations = 0;
  uint64_t pins = 0;
  uint64_t slabs = 0;
  uint64_t events = 0;
};

}  // namespace tierd

#endif  // TIERD_GPU_GPU_TIER_STATS_H_
