#include "gpu/detail/landed_copies.h"

#include <algorithm>
#include <utility>

#include "common/log.h"

namespace tierd {

bool LandedCopies::unstarted() const {
  absl::MutexLock lock(&mu_);
  return stream_ == nullptr && !closed_;
}

void LandedCopies::Start(Stream& stream, uint8_t* staging) {
  absl::MutexLock lock(&mu_);
  if (stream_ != nullptr || closed_) return;
  stream_ = &stream;
  staging_ = staging;
}

void LandedCopies::Queued() {
  absl::MutexLock lock(&mu_);
  ++queued_;
}

void LandedCopies::AwaitQueued() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](const uint64_t* queued) { return *queued == 0; }, &queued_));
}

void LandedCopies::Landed(const uint8_t* bytes, uint64_t begin, uint64_t end) {
  absl::MutexLock lock(&mu_);
  if (queued_ > 0) --queued_;
  end = std::min(end, size_);
  if (begin >= end) return;
  if (stream_ == nullptr || closed_ || discarded_) return;
  // Enqueued under the lock, so that once Close returns nothing more is. The device enqueues
  // without waiting for earlier copies.
  enqueued_any_ = true;
  if (absl::Status status = copier_.CopyChunked(*stream_, staging_ + begin, bytes, end - begin,
                                                /*host_is_dst=*/false);
      !status.ok()) {
    TIERD_LOG(WARNING) << "copying an object to the GPU as it is read: " << status
                       << "; it is copied whole once read";
    discarded_ = true;
    return;
  }
  copied_.emplace(begin, end);
}

LandedCopies::Parts LandedCopies::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  if (discarded_) return {};
  return copied_;
}

void LandedCopies::Discard() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  discarded_ = true;
}

Stream* LandedCopies::stream() const {
  absl::MutexLock lock(&mu_);
  return stream_;
}

bool LandedCopies::enqueued_any() const {
  absl::MutexLock lock(&mu_);
  return enqueued_any_;
}

LandedCopies::Parts PartsLeft(const LandedCopies::Parts& copied, uint64_t size) {
  LandedCopies::Parts left;
  uint64_t at = 0;
  for (const auto& [begin, end] : copied) {
    if (at >= size) break;
    if (begin > at) left.emplace(at, std::min(begin, size));
    at = std::max(at, end);
  }
  if (at < size) left.emplace(at, size);
  return left;
}

}  // namespace tierd
