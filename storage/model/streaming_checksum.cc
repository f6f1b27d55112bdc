#include "storage/model/streaming_checksum.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

namespace tierd {

StreamingChecksum::StreamingChecksum(const uint8_t* data, uint64_t size)
    : data_(data), size_(size), state_(XXH3_createState()) {
  // XXH3_createState fails only when malloc does, as operator new would.
  if (state_ == nullptr) std::abort();
  XXH3_64bits_reset(state_.get());
}

void StreamingChecksum::Landed(uint64_t begin, uint64_t end) {
  absl::MutexLock lock(&mu_);
  begin = std::max(begin, hashed_);
  end = std::min(end, size_);
  if (begin < end) {
    // Merge with the waiting ranges it touches or overlaps.
    auto it = waiting_.upper_bound(begin);
    if (it != waiting_.begin() && std::prev(it)->second >= begin) --it;
    uint64_t merged_begin = begin, merged_end = end;
    while (it != waiting_.end() && it->first <= merged_end) {
      merged_begin = std::min(merged_begin, it->first);
      merged_end = std::max(merged_end, it->second);
      it = waiting_.erase(it);
    }
    waiting_.emplace(merged_begin, merged_end);
  }
  if (hashing_) return;  // the hashing thread will find it
  HashWaitingLocked(kBytesHashedPerByteTold * (end > begin ? end - begin : 0));
}

std::optional<uint64_t> StreamingChecksum::Finish() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* hashing) { return !*hashing; }, &hashing_));
  HashWaitingLocked(size_);
  if (hashed_ != size_) return std::nullopt;
  return XXH3_64bits_digest(state_.get());
}

void StreamingChecksum::HashWaitingLocked(uint64_t budget) {
  hashing_ = true;
  // A range that landed while the lock was dropped below may start inside what was being hashed
  // (a part told twice): it goes on from where the hash got to.
  while (budget > 0 && !waiting_.empty() && waiting_.begin()->first <= hashed_) {
    const uint64_t from = hashed_;
    const uint64_t end = waiting_.begin()->second;
    waiting_.erase(waiting_.begin());
    if (end <= from) continue;
    const uint64_t to = std::min(end, from + budget);
    if (to < end) waiting_.emplace(to, end);  // the rest: a later call's, or Finish's
    budget -= to - from;
    mu_.Unlock();
    XXH3_64bits_update(state_.get(), data_ + from, to - from);
    mu_.Lock();
    hashed_ = to;
  }
  hashing_ = false;
}

}  // namespace tierd
