#include "storage/read_request.h"

#include <algorithm>

namespace tierd {

uint64_t DiskBytesToRead(std::vector<std::pair<uint64_t, uint64_t>> ranges) {
  const auto align_down = [](uint64_t value) {
    return value / kDiskReadAlignment * kDiskReadAlignment;
  };
  std::sort(ranges.begin(), ranges.end());
  uint64_t bytes = 0;
  uint64_t begin = 0, end = 0;  // the span being joined
  bool open = false;
  for (const auto& [offset, length] : ranges) {
    if (length == 0) continue;
    const uint64_t first = align_down(offset);
    const uint64_t last = align_down(offset + length + kDiskReadAlignment - 1);
    if (open && first <= end + kMaxMergedGap) {
      end = std::max(end, last);
      continue;
    }
    if (open) bytes += end - begin;
    begin = first;
    end = last;
    open = true;
  }
  if (open) bytes += end - begin;
  return bytes;
}

}  // namespace tierd
