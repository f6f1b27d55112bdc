// The key space of one GPU tier's stored objects: the prefix its client group's stored objects
// carry in the host cache and the durable store (which tiers share), and the size and tensor index
// of each committed stored object, which fetches need after the GPU copy is gone.
//
// Model weights are shared by every tier under their own keys; a client group's tier acts in the
// host cache only on its own stored objects and on weights (OwnHostKey). Thread-safe: it has its
// own lock, as nothing else of the tier must change together with it.
#ifndef TIERD_GPU_DETAIL_STORED_KEY_SPACE_H_
#define TIERD_GPU_DETAIL_STORED_KEY_SPACE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/gpu_tier_types.h"
#include "storage/model/catalog.h"

namespace tierd {

class StoredKeySpace {
 public:
  struct Meta {
    uint64_t size = 0;
    Tensors tensors;
  };

  // `catalog` must outlive this. `prefix` is empty for the daemon's default tier.
  StoredKeySpace(const Catalog& catalog, std::string prefix)
      : catalog_(catalog), prefix_(std::move(prefix)) {}
  StoredKeySpace(const StoredKeySpace&) = delete;
  StoredKeySpace& operator=(const StoredKeySpace&) = delete;

  const std::string& prefix() const { return prefix_; }
  // The host cache's (and the durable store's) key for this tier's `key`: stored objects carry
  // the tier's prefix, model weights are shared.
  std::string HostKey(const std::string& key, bool stored) const {
    return stored ? prefix_ + key : key;
  }
  // The host key of `key` when this tier may act on it in the host cache: its own stored objects,
  // model weights, and (in the default tier) whatever else the host cache holds under that key.
  // NOT_FOUND for another client group's objects; INVALID_ARGUMENT for a malformed key.
  absl::StatusOr<std::string> OwnHostKey(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether this tier may act on `key` in the host cache, knowing whether it is one of its own
  // stored objects: false only for another group's objects (see OwnHostKey).
  bool MayActOn(const std::string& key, bool stored) const;

  std::optional<Meta> Find(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  bool Contains(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Lists (or replaces) a committed or recovered stored object.
  void Publish(const std::string& key, Meta meta) ABSL_LOCKS_EXCLUDED(mu_);
  // Unlists `key`; returns whether it was listed.
  bool Remove(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // The listed keys that start with `prefix`, in order.
  std::vector<std::string> KeysUnder(const std::string& prefix) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Catalog& catalog_;
  const std::string prefix_;
  mutable absl::Mutex mu_;
  std::map<std::string, Meta> stored_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_STORED_KEY_SPACE_H_
