#include "storage/model/streaming_checksum.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "storage/model/object_checksum.h"

namespace tierd {

StreamingChecksum::StreamingChecksum(const uint8_t* data, uint64_t size,
                                     SegmentHashed segment_hashed)
    : data_(data),
      size_(size),
      segment_hashed_(std::move(segment_hashed)),
      digests_((size + kChecksumSegmentBytes - 1) / kChecksumSegmentBytes),
      segments_(digests_.size()) {}

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
  // Only the segments this range touches can have more to hash because of it.
  for (uint64_t segment = begin / kChecksumSegmentBytes;
       segment < segments_.size() && SegmentBegin(segment) < end; ++segment) {
    HashLocked(segment);
  }
}

void StreamingChecksum::HashLocked(uint64_t index) {
  for (;;) {
    Segment& segment = segments_[index];
    const uint64_t segment_end = SegmentEnd(index);
    const uint64_t from = SegmentBegin(index) + segment.hashed;
    if (segment.hashing || from == segment_end) return;
    // The landed range holding the next byte to hash, if it has landed.
    auto it = landed_.upper_bound(from);
    if (it == landed_.begin() || std::prev(it)->second <= from) return;
    const uint64_t to = std::min(segment_end, std::prev(it)->second);
    const bool whole = segment.hashed == 0 && to == segment_end;
    if (!whole && segment.state == nullptr) segment.state = NewXxh3State();
    segment.hashing = true;
    ++hashing_;
    XXH3_state_t* const state = segment.state.get();
    mu_.Unlock();
    // Segments_ is not resized: `segment` stays valid, and its state and digest are this thread's
    // while it hashes.
    if (whole) {
      digests_[index] = XXH3_64bits(data_ + from, to - from);
    } else {
      XXH3_64bits_update(state, data_ + from, to - from);
      if (to == segment_end) digests_[index] = XXH3_64bits_digest(state);
    }
    // Still counted in hashing_: Finish does not return before this does.
    if (to == segment_end && segment_hashed_) segment_hashed_(SegmentBegin(index), segment_end);
    mu_.Lock();
    segment.hashed += to - from;
    segment.hashing = false;
    --hashing_;
    hashed_bytes_ += to - from;
    if (to == segment_end) {
      segment.state.reset();
      return;
    }
    // More may have landed while mu_ was dropped: those landings left it to this thread.
  }
}

std::optional<uint64_t> StreamingChecksum::Finish() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* hashing) { return *hashing == 0; }, &hashing_));
  // Landings hash all they let be hashed: a segment not hashed through lacks bytes.
  if (hashed_bytes_ != size_) return std::nullopt;
  return CombineSegmentChecksums(size_, digests_);
}

}  // namespace tierd
