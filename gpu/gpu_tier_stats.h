// What a GPU tier counts: GpuTier::stats(), summed over client groups by server/stats.cc.
#ifndef TIERD_GPU_GPU_TIER_STATS_H_
#define TIERD_GPU_GPU_TIER_STATS_H_

#include <cstdint>
#include <iterator>

#include "common/figures.h"

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
  uint64_t shards_cut = 0;  // shards copied out of their whole object's host bytes
  // Of bytes_host_to_gpu, those copied on while their object was still being read into the host
  // tier, as they landed (gpu/detail/landed_copies.h).
  uint64_t bytes_copied_as_landed = 0;
  // Objects copied to the GPU compressed and decoded there; the compressed bytes that crossed
  // the link for them; decodes that found a tile not matching its checksum; the device's time
  // decoding them (CompressedCopies::Verdict), failed ones too.
  uint64_t objects_decoded = 0;
  uint64_t bytes_host_to_gpu_compressed = 0;
  uint64_t decode_failures = 0;
  uint64_t decode_micros = 0;
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
};

// How each figure is reported (common/figures.h). budget_bytes … evictions, slabs and the client
// figures are also a client group's (ClientGroupStats has fields of the same names).
inline constexpr Figure<GpuTierStats> kGpuTierFigures[] = {
    {"gpu.budget_bytes", &GpuTierStats::budget_bytes},
    {"gpu.used_bytes", &GpuTierStats::used_bytes},
    {"gpu.objects", &GpuTierStats::objects},
    {"gpu.hits", &GpuTierStats::hits},
    {"gpu.misses", &GpuTierStats::misses},
    {"gpu.evictions", &GpuTierStats::evictions},
    {"bytes_host_to_gpu", &GpuTierStats::bytes_host_to_gpu},
    {"bytes_gpu_to_host", &GpuTierStats::bytes_gpu_to_host},
    {"shards_cut", &GpuTierStats::shards_cut},
    {"bytes_copied_as_landed", &GpuTierStats::bytes_copied_as_landed},
    {"objects_decoded", &GpuTierStats::objects_decoded},
    {"bytes_host_to_gpu_compressed", &GpuTierStats::bytes_host_to_gpu_compressed},
    {"decode_failures", &GpuTierStats::decode_failures},
    {"decode_micros", &GpuTierStats::decode_micros},
    {"peer_fetches", &GpuTierStats::peer_fetches},
    {"bytes_peer_to_gpu", &GpuTierStats::bytes_peer_to_gpu},
    {"peer_fetches_through_host", &GpuTierStats::peer_fetches_through_host},
    {"copies_in_flight", &GpuTierStats::copies_in_flight},
    {"gpu_allocation_waiters", &GpuTierStats::allocation_waiters},
    {"sessions", &GpuTierStats::clients},
    {"leases", &GpuTierStats::leases},
    {"reservations", &GpuTierStats::reservations},
    {"pins", &GpuTierStats::pins},
    {"slabs", &GpuTierStats::slabs},
};
static_assert(std::size(kGpuTierFigures) * sizeof(uint64_t) == sizeof(GpuTierStats),
              "every member of GpuTierStats has its line in kGpuTierFigures");

}  // namespace tierd

#endif  // TIERD_GPU_GPU_TIER_STATS_H_
