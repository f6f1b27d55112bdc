#include "common/free_ranges.h"

#include <algorithm>
#include <iterator>

namespace tierd {

void FreeRanges::Add(uint64_t offset, uint64_t size) {
  if (size == 0) return;
  free_bytes_ += size;
  auto next = ranges_.lower_bound(offset);
  if (next != ranges_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      offset = previous->first;
      size += previous->second;
      ranges_.erase(previous);
    }
  }
  if (next != ranges_.end() && offset + size == next->first) {
    size += next->second;
    ranges_.erase(next);
  }
  ranges_[offset] = size;
}

std::optional<uint64_t> FreeRanges::Take(uint64_t size) {
  if (size == 0) return std::nullopt;
  for (auto it = ranges_.begin(); it != ranges_.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - size;
    ranges_.erase(it);
    if (rest > 0) ranges_[offset + size] = rest;
    free_bytes_ -= size;
    return offset;
  }
  return std::nullopt;
}

bool FreeRanges::TakeAt(uint64_t offset, uint64_t size) {
  if (size == 0) return false;
  auto it = ranges_.upper_bound(offset);
  if (it == ranges_.begin()) return false;
  --it;
  const uint64_t start = it->first;
  const uint64_t end = start + it->second;
  if (offset + size < offset || offset + size > end) return false;
  ranges_.erase(it);
  if (offset > start) ranges_[start] = offset - start;
  if (offset + size < end) ranges_[offset + size] = end - offset - size;
  free_bytes_ -= size;
  return true;
}

uint64_t FreeRanges::largest() const {
  uint64_t largest = 0;
  for (const auto& [offset, size] : ranges_) largest = std::max(largest, size);
  return largest;
}

}  // namespace tierd
