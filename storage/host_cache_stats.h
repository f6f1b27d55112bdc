// What the host cache counts: HostCache::stats().
#ifndef TIERD_STORAGE_HOST_CACHE_STATS_H_
#define TIERD_STORAGE_HOST_CACHE_STATS_H_

#include <cstdint>

namespace tierd {

struct HostCacheStats {
  uint64_t capacity_bytes = 0;
  uint64_t pinned_bytes = 0;  // of the arena, pinned so far
  uint64_t used_bytes = 0;
  uint64_t objects = 0;          // resident
  uint64_t stored_objects = 0;   // resident or spilled
  uint64_t spilled_objects = 0;  // on disk only
  uint64_t loading = 0;          // reads in flight
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t spills = 0;
  uint64_t spill_failures = 0;
  uint64_t bytes_from_disk = 0;  // weights and spilled objects read back
  uint64_t bytes_to_spill = 0;
  uint64_t checksum_failures = 0;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_CACHE_STATS_H_
