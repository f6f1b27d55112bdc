// Evictions asked for by an operator or a client (GpuTier::Evict, GpuTier::ForgetModel,
// GpuTier::ForgetStoredUnder) of a key
// or of every key under a prefix, from the GPU tier, the host tier or both; and the deletion of
// stored objects (EvictTier::kAll), from the durable store too. A client group's tier acts only on
// its own stored objects and on model weights (StoredKeySpace::OwnHostKey).
//
// Internal to the GPU tier. Holds no state of its own; it takes the tier's lock for the GPU side
// and calls the host cache and the durable store without it. Thread-safe.
#ifndef TIERD_GPU_DETAIL_EXPLICIT_EVICTION_H_
#define TIERD_GPU_DETAIL_EXPLICIT_EVICTION_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/detail/staging_residency.h"
#include "gpu/detail/stored_key_space.h"
#include "gpu/detail/tier_parts.h"
#include "gpu/gpu_tier_stats.h"
#include "gpu/gpu_tier_types.h"
#include "storage/host/durable_store.h"
#include "storage/host/host_cache.h"
#include "storage/model/catalog.h"

namespace tierd {

class ExplicitEviction {
 public:
  // The tier's shared parts and the tiers below it; all must outlive this. `durable_store` may be
  // null.
  ExplicitEviction(const TierParts& tier, HostCache& host_cache, DurableStore* durable_store,
                   StoredKeySpace& stored)
      : mu_(tier.mu),
        catalog_(tier.catalog),
        host_cache_(host_cache),
        durable_store_(durable_store),
        residency_(tier.residency),
        stored_(stored),
        stats_(tier.stats) {}
  ExplicitEviction(const ExplicitEviction&) = delete;
  ExplicitEviction& operator=(const ExplicitEviction&) = delete;

  // As GpuTier::Evict and GpuTier::ForgetModel.
  absl::StatusOr<EvictResult> Evict(const std::string& key_or_prefix, EvictTier tier)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ForgetModel(const std::string& model) ABSL_LOCKS_EXCLUDED(mu_);
  // As GpuTier::ForgetStoredUnder.
  size_t ForgetStoredUnder(const std::string& model) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex& mu_;
  const Catalog& catalog_;
  HostCache& host_cache_;
  DurableStore* const durable_store_;
  StagingResidency& residency_;
  StoredKeySpace& stored_;
  GpuTierStats& stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tierd

#endif  // TIERD_GPU_DETAIL_EXPLICIT_EVICTION_H_
