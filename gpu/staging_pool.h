// The GPU staging pool: --gpu-pool-bytes of exportable device memory in a few large slabs, so a
// client opens one IPC handle per slab rather than one per object. Ranges are handed out first
// fit within a slab, aligned to kStagingAlignment.
//
// Thread-safe.
#ifndef TIERD_GPU_STAGING_POOL_H_
#define TIERD_GPU_STAGING_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/free_ranges.h"
#include "device/device.h"

namespace tierd {

// Every range starts at a multiple of this, so tensors inside objects keep their alignment.
inline constexpr uint64_t kStagingAlignment = 4096;

struct StagingRange {
  uint32_t slab = 0;
  uint64_t offset = 0;
  uint64_t size = 0;  // rounded up to kStagingAlignment; 0 for an empty object
};

// Whether an object of `bytes` fits in a slab of `slab_bytes` once aligned (false, not an overflow,
// for sizes near 2^64).
inline bool FitsInSlab(uint64_t bytes, uint64_t slab_bytes) {
  return bytes <= slab_bytes && RoundUp(bytes, kStagingAlignment) <= slab_bytes;
}

struct StagingSlabInfo {
  uint32_t id = 0;
  uint64_t size = 0;
  std::string handle;
};

class StagingPool;

// A range of staging memory, owned: it goes back to its pool when the handle is destroyed or
// reset. Move-only; a moved-from handle owns nothing (size 0). REQUIRES: the pool outlives the
// handle, except after release(). Not thread-safe (the pool's Free is).
class StagingAllocation {
 public:
  StagingAllocation() = default;
  ~StagingAllocation() { reset(); }
  StagingAllocation(StagingAllocation&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)), range_(std::exchange(other.range_, {})) {}
  StagingAllocation& operator=(StagingAllocation&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = std::exchange(other.pool_, nullptr);
      range_ = std::exchange(other.range_, {});
    }
    return *this;
  }
  StagingAllocation(const StagingAllocation&) = delete;
  StagingAllocation& operator=(const StagingAllocation&) = delete;

  const StagingRange& range() const { return range_; }
  uint64_t size() const { return range_.size; }
  // Frees the range now; the handle owns nothing afterwards.
  void reset();
  // Gives the range up without freeing it: where the pool may be gone, or where the device may
  // still use the range (then it is never handed out again).
  StagingRange release() {
    pool_ = nullptr;
    return std::exchange(range_, {});
  }

 private:
  friend class StagingPool;
  StagingAllocation(StagingPool* pool, StagingRange range) : pool_(pool), range_(range) {}

  StagingPool* pool_ = nullptr;
  StagingRange range_;
};

class StagingPool {
 public:
  // Allocates ceil(pool_bytes / slab_bytes) slabs (the last one smaller). Errors:
  // INVALID_ARGUMENT for a zero size; RESOURCE_EXHAUSTED when the device has not that much memory.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(Device& device, uint64_t pool_bytes,
                                                             uint64_t slab_bytes);
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A range of at least `bytes`, or nullopt when no slab has a free hole that large. 0 bytes: an
  // empty range (size 0), which takes nothing. The range is freed when the handle goes.
  std::optional<StagingAllocation> Allocate(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Exactly `range` (an earlier allocation's, so aligned), or nullopt when any of it is taken or it
  // lies outside the pool. How an object woken from sleep comes back at the device addresses it had
  // (gpu/retained_sets.h).
  std::optional<StagingAllocation> AllocateAt(const StagingRange& range) ABSL_LOCKS_EXCLUDED(mu_);

  // Device address of `range` in this process.
  uint8_t* data(const StagingRange& range) const;
  uint64_t capacity() const { return capacity_; }
  uint64_t largest_slab() const { return largest_slab_; }
  uint64_t used_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t slab_count() const { return slabs_.size(); }
  std::vector<StagingSlabInfo> Slabs() const;
  // Slab `id`. REQUIRES: id < slab_count().
  StagingSlabInfo SlabInfo(uint32_t id) const;

 private:
  friend class StagingAllocation;
  explicit StagingPool(std::vector<std::unique_ptr<Slab>> slabs);
  // Ignores an empty range. REQUIRES: `range` came from Allocate and was not freed yet.
  void Free(const StagingRange& range) ABSL_LOCKS_EXCLUDED(mu_);

  const std::vector<std::unique_ptr<Slab>> slabs_;
  const uint64_t capacity_;
  const uint64_t largest_slab_;
  mutable absl::Mutex mu_;
  std::vector<FreeRanges> free_ ABSL_GUARDED_BY(mu_);  // per slab
};

}  // namespace tierd

#endif  // TIERD_GPU_STAGING_POOL_H_
