// What HostCache keeps about each object beyond the residency core's refs, pins and memory.
// Internal to storage/host/host_cache*.cc.
#ifndef TIERD_STORAGE_HOST_DETAIL_HOST_CACHE_RECORD_H_
#define TIERD_STORAGE_HOST_DETAIL_HOST_CACHE_RECORD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "codec/exponent_format.h"
#include "storage/host/detail/landed_listeners.h"
#include "storage/host/host_cache.h"
#include "storage/io/disk_reader.h"
#include "storage/io/read_router.h"
#include "storage/model/catalog.h"
#include "storage/model/streaming_checksum.h"

namespace tierd {

// A failed spill (a full or failing disk) is not retried at once: room is then looked for
// elsewhere, or the request is refused, instead of spinning on the same failure.
inline constexpr absl::Duration kSpillRetryDelay = absl::Seconds(1);

struct HostCacheRecord {
  enum class Kind { kWeight, kStored };
  enum class State {
    kAllocating,  // waiting for memory
    kLoading,     // being read from disk
    kResident,
    kWriting,  // a reservation not committed yet
    kSpilled,  // on disk only
  };

  Kind kind = Kind::kWeight;
  State state = State::kAllocating;
  // The object's bytes start this far into `memory`: the file offset's position within its 4 KiB
  // block, so that a contiguous object's aligned superset fits the allocation and is read in place.
  uint64_t head = 0;
  uint64_t size = 0;
  std::optional<ObjectRef> source;  // weights: where the bytes are in the model's files
  // Stored objects.
  bool spillable = false;
  bool spilling = false;  // a spill write is in flight; the memory stays valid meanwhile
  // When its last spill failed (a full disk): it is not tried again before kSpillRetryDelay.
  absl::Time spill_failed_at = absl::InfinitePast();
  std::string spill_path;     // set once a spilled (or durable) copy exists
  uint64_t spill_offset = 0;  // where the object's bytes start in spill_path
  bool durable_copy = false;  // spill_path belongs to the DurableStore: never removed here
  uint64_t checksum = 0;      // of a stored object, computed when it is spilled
  // `checksum` is WholeObjectChecksum's (an older daemon's durable record): read back without
  // hashing as the bytes land.
  bool whole_object_checksum = false;
  // Loading.
  std::vector<HostCache::FetchCallback> waiters;
  std::optional<ReadRouter::RequestId> read_id;
  int submits_pending = 0;  // reads being submitted (the lock is dropped): the entry must stay
  uint64_t load = 0;        // numbers the loads, so a late submit knows whether it is current
  bool demand = false;      // some waiter is a demand fetch
  // This load's bytes were checked by the reader (ReadRequest::check), on its thread before its
  // answer: FinishRead need not check them again.
  bool checked = false;
  // This load's checksum, hashed by the reader's threads as its bytes land (ReadRequest::landed);
  // it has none when the reader did not tell every byte (an object store's), and FinishRead then
  // hashes the object itself.
  std::shared_ptr<StreamingChecksum> streaming;
  // The fetches of this load that want its bytes as they land (HostCache::Fetch's `landed`).
  std::shared_ptr<LandedListeners> landed;
  // Weights: the compressed form `memory` holds instead of the raw bytes, once the compressor
  // has swapped it in (host_cache_compress.cc); and whether the compressor has had this load.
  std::optional<codec::CompressedLayout> compressed;
  bool compression_planned = false;

  bool MaySpillAgain() const { return absl::Now() - spill_failed_at >= kSpillRetryDelay; }
  // Work in flight uses the entry: it is neither evicted nor freed.
  bool busy() const {
    return state == State::kAllocating || state == State::kLoading || spilling ||
           submits_pending > 0 || !waiters.empty();
  }
};

// What a resident record's memory holds: its compressed form, or its raw bytes.
inline uint64_t StoredBytes(const HostCacheRecord& record) {
  return record.compressed ? record.compressed->encoded_bytes : record.size;
}

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_DETAIL_HOST_CACHE_RECORD_H_
