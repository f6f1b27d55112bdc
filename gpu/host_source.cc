#include "gpu/host_source.h"

#include <utility>

#include "common/log.h"

namespace tierd {

HostBytes::HostBytes(HostObject object, const PinnedPieceBoundaries& pieces)
    : object_(std::move(object)), data_(object_.data()), size_(object_.size()), pieces_(&pieces) {
  if (const codec::CompressedLayout* layout = object_.compressed()) compressed_ = *layout;
}

HostBytes::HostBytes(const uint8_t* data, uint64_t size, const PinnedPieceBoundaries& pieces,
                     absl::AnyInvocable<void() &&> release,
                     std::optional<codec::CompressedLayout> compressed)
    : data_(data),
      size_(size),
      compressed_(std::move(compressed)),
      pieces_(&pieces),
      release_(std::move(release)) {}

HostBytes& HostBytes::operator=(HostBytes&& other) noexcept {
  if (this != &other) {
    Reset();
    object_ = std::move(other.object_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    compressed_ = std::exchange(other.compressed_, std::nullopt);
    pieces_ = std::exchange(other.pieces_, nullptr);
    release_ = std::move(other.release_);
    other.release_ = nullptr;
  }
  return *this;
}

void HostBytes::Reset() {
  object_.Reset();
  data_ = nullptr;
  size_ = 0;
  compressed_.reset();
  pieces_ = nullptr;
  if (release_) std::exchange(release_, nullptr)();
}

void LocalHostSource::Fetch(const std::string& key, ReadPriority priority, absl::Time deadline,
                            Callback done, HostCache::LandedCallback landed) {
  cache_.Fetch(
      key, priority, deadline,
      [this, done = std::move(done)](absl::StatusOr<HostObject> object) mutable {
        if (!object.ok()) return std::move(done)(object.status());
        std::move(done)(HostBytes(*std::move(object), arena_));
      },
      std::move(landed));
}

void LocalHostSource::Distrust(const std::string& key) {
  // Forgotten even while referenced: the next fetch reads it from its files again.
  if (absl::Status discarded = cache_.Discard(key); !discarded.ok()) {
    TIERD_LOG(WARNING) << "could not drop the host copy of " << key << ": " << discarded;
  }
}

}  // namespace tierd
