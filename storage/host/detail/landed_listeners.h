// The fetches that asked to be told of a load's bytes as they land (HostCache::Fetch's `landed`):
// each segment hashed through is told to every listener added before it was. Internal to
// storage/host/host_cache*.cc.
//
// Thread-safe. Its lock is taken under the cache's, and no call is made under it: a listener may
// take locks of its own (the GPU tier's copies) without ordering them against the cache's.
#ifndef TIERD_STORAGE_HOST_DETAIL_LANDED_LISTENERS_H_
#define TIERD_STORAGE_HOST_DETAIL_LANDED_LISTENERS_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/host/host_cache.h"

namespace tierd {

class LandedListeners {
 public:
  void Add(HostCache::LandedCallback listener) ABSL_LOCKS_EXCLUDED(mu_) {
    auto shared = std::make_shared<const HostCache::LandedCallback>(std::move(listener));
    absl::MutexLock lock(&mu_);
    listeners_.push_back(std::move(shared));
  }

  // Tells every listener that [begin, end) of the object, at `bytes`, has landed.
  void Tell(const uint8_t* bytes, uint64_t begin, uint64_t end) const ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::shared_ptr<const HostCache::LandedCallback>> listeners;
    {
      absl::MutexLock lock(&mu_);
      listeners = listeners_;
    }
    for (const auto& listener : listeners) (*listener)(bytes, begin, end);
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<const HostCache::LandedCallback>> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_STORAGE_HOST_DETAIL_LANDED_LISTENERS_H_
