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
    while (it != waiting_.end() && it->first <= end) {
      begin = std::min(begin, it->first);
      end = std::max(end, it->second);
      it = waiting_.erase(it);
    }
    waiting_.emplace(begin, end);
  }
  if (hashing_) return;  // the hashing thread will find it
  hashing_ = true;
  // A range that landed while the lock was dropped below may start inside what was being hashed
  // (a part told twice): it goes on from where the hash got to.
  while (!waiting_.empty() && waiting_.begin()->first <= hashed_) {
    const uint64_t from = hashed_;
    const uint64_t to = waiting_.begin()->second;
    waiting_.erase(waiting_.begin());
    if (to <= from) continue;
    mu_.Unlock();
    XXH3_64bits_update(state_.get(), data_ + from, to - from);
    mu_.Lock();
    hashed_ = to;
  }
  hashing_ = false;
}

std::optional<uint64_t> StreamingChecksum::Checksum() const {
  absl::MutexLock lock(&mu_);
  if (hashed_ != size_ || hashing_) return std::nullopt;
  return XXH3_64bits_digest(state_.get());
}

}  // namespace tierd
