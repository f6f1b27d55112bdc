// The free space of a region, as coalesced [offset, offset + size) ranges, handed out first fit.
// Used by the pinned host arena and the GPU staging pool. Not thread-safe: its owner locks.
#ifndef TIERD_COMMON_FREE_RANGES_H_
#define TIERD_COMMON_FREE_RANGES_H_

#include <cstdint>
#include <map>
#include <optional>

namespace tierd {

// `value` rounded up to a multiple of `multiple` (> 0).
inline uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

class FreeRanges {
 public:
  // Returns a range to the free space, merging it with its neighbours.
  // REQUIRES: it overlaps no free range.
  void Add(uint64_t offset, uint64_t size);
  // Takes `size` (> 0) bytes from the lowest free range large enough, or nullopt. First fit keeps
  // allocations packed towards the start, which leaves large holes at the end.
  std::optional<uint64_t> Take(uint64_t size);
  // Takes exactly [offset, offset + size) (size > 0) when all of it is free; false otherwise.
  bool TakeAt(uint64_t offset, uint64_t size);

  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest() const;

 private:
  std::map<uint64_t, uint64_t> ranges_;  // offset → size
  uint64_t free_bytes_ = 0;
};

}  // namespace tierd

#endif  // TIERD_COMMON_FREE_RANGES_H_
