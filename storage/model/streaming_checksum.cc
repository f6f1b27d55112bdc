#include "storage/model/streaming_checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <iterator>

#include "storage/model/object_checksum.h"

namespace tierd {

StreamingChecksum::StreamingChecksum(const uint8_t* data, uint64_t size)
    : data_(data),
      size_(size),
      digests_((size + kChecksumSegmentBytes - 1) / kChecksumSegmentBytes),
      segments_(digests_.size(), Segment::kWaiting) {}

uint64_t StreamingChecksum::SegmentBegin(uint64_t segment) const {
  return segment * kChecksumSegmentBytes;
}

uint64_t StreamingChecksum::SegmentEnd(uint64_t segment) const {
  return std::min(size_, (segment + 1) * kChecksumSegmentBytes);
}

void StreamingChecksum::Landed(uint64_t begin, uint64_t end) {
  absl::MutexLock lock(&mu_);
  end = std::min(end, size_);
  if (begin >= end) return;
  // Merge with the landed ranges it touches or overlaps.
  auto it = landed_.upper_bound(begin);
  if (it != landed_.begin() && std::prev(it)->second >= begin) --it;
  uint64_t merged_begin = begin, merged_end = end;
  while (it != landed_.end() && it->first <= merged_end) {
    merged_begin = std::min(merged_begin, it->first);
    merged_end = std::max(merged_end, it->second);
    it = landed_.erase(it);
  }
  landed_.emplace(merged_begin, merged_end);
  // Only the segments this range touches can have been completed by it.
  std::vector<uint64_t> completed;
  for (uint64_t segment = begin / kChecksumSegmentBytes;
       segment < segments_.size() && SegmentBegin(segment) < end; ++segment) {
    if (segments_[segment] == Segment::kWaiting && SegmentBegin(segment) >= merged_begin &&
        SegmentEnd(segment) <= merged_end) {
      segments_[segment] = Segment::kHashing;
      completed.push_back(segment);
    }
  }
  if (!completed.empty()) HashLocked(completed);
}

void StreamingChecksum::HashLocked(const std::vector<uint64_t>& segments) {
  hashing_ += static_cast<int>(segments.size());
  mu_.Unlock();
  for (uint64_t segment : segments) {
    digests_[segment] = XXH3_64bits(data_ + SegmentBegin(segment),
                                    SegmentEnd(segment) - SegmentBegin(segment));
  }
  mu_.Lock();
  for (uint64_t segment : segments) {
    segments_[segment] = Segment::kHashed;
    hashed_bytes_ += SegmentEnd(segment) - SegmentBegin(segment);
  }
  hashing_ -= static_cast<int>(segments.size());
}

std::optional<uint64_t> StreamingChecksum::Finish() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* hashing) { return *hashing == 0; }, &hashing_));
  // The landing that completes a segment hashes it: one still waiting lacks bytes.
  if (hashed_bytes_ != size_) return std::nullopt;
  return CombineSegmentChecksums(size_, digests_);
}

}  // namespace tierd
