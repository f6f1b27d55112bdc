// What the host cache counts: HostCache::stats().
#ifndef TIERD_STORAGE_HOST_HOST_CACHE_STATS_H_
#define TIERD_STORAGE_HOST_HOST_CACHE_STATS_H_

#include <cstdint>
#include <iterator>

#include "common/figures.h"

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
  // Reads checksummed as their bytes landed (ReadRequest::landed: by the reader's threads, what
  // they left by a checksum thread once the read was done), rather than in one pass afterwards.
  uint64_t checksums_while_reading = 0;
  // Read from disk by the disk reader: bytes_from_disk and the reads' rounding to 4 KiB blocks
  // (a shard's rows narrower than a block read their neighbours' bytes too).
  uint64_t disk_bytes_read = 0;
  // Fetched from object storage by the remote reader (models registered from s3:// URLs): these
  // bytes are counted in bytes_from_disk too, as the host tier's reads from below; with a remote
  // cache, whole chunks, the bytes beside a read range included.
  uint64_t remote_bytes_read = 0;
  // Of the remote models' bytes, those served from the local remote cache (--remote-cache-dir).
  uint64_t remote_cache_bytes_read = 0;
  // Weights held compressed (codec/): how many are resident so, the bytes they take, and the
  // bytes they would take raw; and the objects the compressor has encoded or kept raw so far.
  uint64_t compressed_objects = 0;
  uint64_t compressed_bytes = 0;
  uint64_t compressed_raw_bytes = 0;
  uint64_t objects_encoded = 0;
  uint64_t objects_kept_raw = 0;
};

// How each figure is reported (common/figures.h).
inline constexpr Figure<HostCacheStats> kHostCacheFigures[] = {
    {"host.budget_bytes", &HostCacheStats::capacity_bytes},
    {"host_pinned_bytes", &HostCacheStats::pinned_bytes},
    {"host.used_bytes", &HostCacheStats::used_bytes},
    {"host.objects", &HostCacheStats::objects},
    {"stored_objects", &HostCacheStats::stored_objects},
    {"spilled_objects", &HostCacheStats::spilled_objects},
    {"disk_reads_in_flight", &HostCacheStats::loading},
    {"host.hits", &HostCacheStats::hits},
    {"host.misses", &HostCacheStats::misses},
    {"host.evictions", &HostCacheStats::evictions},
    {"spills", &HostCacheStats::spills},
    {"spill_failures", &HostCacheStats::spill_failures},
    {"bytes_disk_to_host", &HostCacheStats::bytes_from_disk},
    {"bytes_host_to_disk", &HostCacheStats::bytes_to_spill},
    {"checksum_failures", &HostCacheStats::checksum_failures},
    {"checksums_while_reading", &HostCacheStats::checksums_while_reading},
    {"disk_bytes_read", &HostCacheStats::disk_bytes_read},
    {"remote_bytes_read", &HostCacheStats::remote_bytes_read},
    {"remote_cache_bytes_read", &HostCacheStats::remote_cache_bytes_read},
    {"host_compressed_objects", &HostCacheStats::compressed_objects},
    {"host_compressed_bytes", &HostCacheStats::compressed_bytes},
    {"host_compressed_raw_bytes", &HostCacheStats::compressed_raw_bytes},
    {"objects_encoded", &HostCacheStats::objects_encoded},
    {"objects_kept_raw", &HostCacheStats::objects_kept_raw},
};
static_assert(std::size(kHostCacheFigures) * sizeof(uint64_t) == sizeof(HostCacheStats),
              "every member of HostCacheStats has its line in kHostCacheFigures");

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_HOST_CACHE_STATS_H_
