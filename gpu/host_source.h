// Where the GPU tier gets an object's bytes in pinned host memory: the daemon's own host cache, or
// — on a node of several daemons (tierd --peers) — the host arena of the daemon that is the
// object's home (server/node/node_host_tier.h). The tier copies from a HostBytes to staging and
// resets it once the copy has completed; what it references stays put until then.
#ifndef TIERD_GPU_HOST_SOURCE_H_
#define TIERD_GPU_HOST_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "codec/exponent_format.h"
#include "gpu/chunked_copier.h"
#include "storage/host/host_arena.h"
#include "storage/host/host_cache.h"
#include "storage/read_request.h"

namespace tierd {

// An object's bytes in pinned host memory, held until Reset (or destruction). Move-only.
class HostBytes {
 public:
  HostBytes() = default;
  // An object of this daemon's host cache, in memory registered as `pieces` says.
  HostBytes(HostObject object, const PinnedPieceBoundaries& pieces);
  // Bytes held by someone else: `release` runs once, from Reset, and gives them back. It must not
  // block. `pieces` must outlive the bytes. With `compressed`, `data` holds the object's compressed
  // form (compressed->encoded_bytes bytes) and `size` is the object's raw size.
  HostBytes(const uint8_t* data, uint64_t size, const PinnedPieceBoundaries& pieces,
            absl::AnyInvocable<void() &&> release,
            std::optional<codec::CompressedLayout> compressed = std::nullopt);
  HostBytes(HostBytes&& other) noexcept { *this = std::move(other); }
  HostBytes& operator=(HostBytes&& other) noexcept;
  ~HostBytes() { Reset(); }
  HostBytes(const HostBytes&) = delete;
  HostBytes& operator=(const HostBytes&) = delete;

  bool valid() const { return data_ != nullptr || object_.valid(); }
  // The object's bytes, or its compressed form when compressed() is set (see HostObject).
  const uint8_t* data() const { return data_; }
  // The object's raw size.
  uint64_t size() const { return size_; }
  const codec::CompressedLayout* compressed() const {
    return compressed_ ? &*compressed_ : nullptr;
  }
  // The bytes at data().
  uint64_t stored_size() const { return compressed_ ? compressed_->encoded_bytes : size_; }
  // Where the memory's registrations end: a copy must not span two.
  const PinnedPieceBoundaries& pieces() const { return *pieces_; }
  // Gives the bytes back; the handle is then empty.
  void Reset();
  // Says a device copy holds the bytes until it is done (HostObject::HeldByCopy).
  void HeldByCopy() { object_.HeldByCopy(); }

 private:
  HostObject object_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::optional<codec::CompressedLayout> compressed_;
  const PinnedPieceBoundaries* pieces_ = nullptr;
  absl::AnyInvocable<void() &&> release_;
};

class HostSource {
 public:
  using Callback = absl::AnyInvocable<void(absl::StatusOr<HostBytes>) &&>;

  virtual ~HostSource() = default;
  // Brings `key` (a host cache key: a model object, or a stored object's key with its group's
  // prefix) into pinned host memory and calls `done` with its bytes, as HostCache::Fetch does
  // (same errors). `done` may run before Fetch returns; it must not block. `landed`, when given,
  // is told of parts of the object as they land before `done`, as HostCache::Fetch says, where
  // the bytes are read into this daemon's host cache; a source that does not tell leaves it
  // uncalled.
  virtual void Fetch(const std::string& key, ReadPriority priority, absl::Time deadline,
                     Callback done, HostCache::LandedCallback landed = nullptr) = 0;
  // Starts bringing `key` into host memory without holding it (HostCache::Prefetch).
  virtual absl::Status Prefetch(const std::string& key, absl::Time deadline) = 0;
  // Whether `key` is known to be in the host memory Fetch would take it from.
  virtual bool IsResident(const std::string& key) const = 0;
  // The bytes Fetch gave for `key` failed a check on their way to the GPU (a compressed form that
  // does not decode to its checksums): they are dropped where this source can drop them, so that
  // the next fetch reads them again.
  virtual void Distrust(const std::string& key) = 0;
};

// The daemon's own host cache and arena. Thread-safe.
class LocalHostSource : public HostSource {
 public:
  // Both must outlive this.
  LocalHostSource(HostCache& cache, const HostArena& arena) : cache_(cache), arena_(arena) {}

  void Fetch(const std::string& key, ReadPriority priority, absl::Time deadline, Callback done,
             HostCache::LandedCallback landed = nullptr) override;
  absl::Status Prefetch(const std::string& key, absl::Time deadline) override {
    return cache_.Prefetch(key, deadline);
  }
  bool IsResident(const std::string& key) const override { return cache_.IsResident(key); }
  void Distrust(const std::string& key) override;

  HostCache& cache() const { return cache_; }
  const PinnedPieceBoundaries& pieces() const { return arena_; }

 private:
  HostCache& cache_;
  const HostArena& arena_;
};

}  // namespace tierd

#endif  // TIERD_GPU_HOST_SOURCE_H_
