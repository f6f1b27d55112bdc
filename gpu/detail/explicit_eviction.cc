#include "gpu/detail/explicit_eviction.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tierd {

absl::StatusOr<EvictResult> ExplicitEviction::Evict(const std::string& key_or_prefix,
                                                    EvictTier tier) {
  const bool prefix = absl::EndsWith(key_or_prefix, "/");
  if (prefix) {
    RETURN_IF_ERROR(ValidateModelName(key_or_prefix.substr(0, key_or_prefix.size() - 1)));
  } else {
    RETURN_IF_ERROR(SplitObjectKey(key_or_prefix).status());
  }
  std::set<std::string> evicted;
  std::set<std::string> skipped;
  bool known = false;
  // A set: a stored object is listed both here and by the host tier, and is evicted once.
  std::set<std::string> host_keys;
  {
    absl::MutexLock lock(&mu_);
    for (StagingObject* object : residency_.Matching(key_or_prefix, prefix)) {
      known = true;
      const bool stored = object->model == nullptr;
      if (tier == EvictTier::kHost) continue;
      if (residency_.IsEvictable(object)) {
        evicted.insert(object->key());
        ++stats_.evictions;
        residency_.Remove(object);
      } else if (tier == EvictTier::kAll && stored && !object->copying &&
                 object->state == StagingObject::State::kResident) {
        // Deleting a stored object: holders keep their bytes until they release them.
        evicted.insert(object->key());
        residency_.Remove(object);
      } else if (!prefix) {
        return absl::FailedPreconditionError(absl::StrCat(
            key_or_prefix, " is ",
            object->refs > 0   ? absl::StrCat("leased (", object->refs, " lease(s))")
            : object->pins > 0 ? "pinned"
                               : "being copied",
            " on the GPU; it can be evicted once ",
            object->refs > 0 || object->pins > 0 ? "released" : "its copy has completed"));
      } else {
        skipped.insert(object->key());
      }
    }
    if (prefix) {
      for (std::string& key : stored_.KeysUnder(key_or_prefix)) host_keys.insert(std::move(key));
    } else {
      known = known || stored_.Contains(key_or_prefix);
    }
  }
  if (prefix) {
    // The default tier acts on everything the host cache lists under the prefix; a client group's
    // tier on model weights only (its own stored objects were listed from the key space above).
    for (std::string& key : host_cache_.Keys(key_or_prefix)) {
      if (stored_.MayActOn(key, /*stored=*/false)) host_keys.insert(std::move(key));
    }
  } else {
    host_keys.insert(key_or_prefix);
    known = known || catalog_.Lookup(key_or_prefix).ok();
  }
  if (tier != EvictTier::kGpu) {
    for (const std::string& key : host_keys) {
      const bool stored = tier == EvictTier::kAll ? stored_.Remove(key) : stored_.Contains(key);
      if (!stored_.MayActOn(key, stored)) continue;  // another group's object (see OwnHostKey)
      const std::string host_key = stored_.HostKey(key, stored);
      const bool resident = host_cache_.IsResident(host_key);
      const bool deleting = tier == EvictTier::kAll && stored;
      if (deleting && durable_store_ != nullptr) {
        // Off the disk before the answer, so that a restart cannot bring it back.
        RETURN_IF_ERROR(durable_store_->RemoveAndWait(host_key));
      }
      absl::Status status = deleting ? host_cache_.Delete(host_key) : host_cache_.Evict(host_key);
      if (status.ok()) {
        known = true;
        if (resident || stored) evicted.insert(key);
      } else if (status.code() == absl::StatusCode::kFailedPrecondition) {
        known = true;
        if (!prefix) return status;
        skipped.insert(key);
      } else if (status.code() != absl::StatusCode::kNotFound) {
        return status;
      }
    }
  }
  if (!prefix && !known) {
    return absl::NotFoundError(absl::StrCat("no object ", key_or_prefix));
  }
  // An object left in any tier asked for counts as skipped, not evicted.
  for (const std::string& key : skipped) evicted.erase(key);
  return EvictResult{static_cast<uint32_t>(evicted.size()), static_cast<uint32_t>(skipped.size())};
}

void ExplicitEviction::ForgetModel(const std::string& model) {
  const std::string prefix = absl::StrCat(model, "/");
  {
    absl::MutexLock lock(&mu_);
    for (StagingObject* object : residency_.Matching(prefix, /*prefix=*/true)) {
      if (object->model == nullptr) continue;
      residency_.Remove(object);
    }
  }
  // The host cache's copies go too; one still in use is freed when its holder lets go.
  for (const std::string& key : host_cache_.Keys(prefix)) (void)host_cache_.Evict(key);
}

size_t ExplicitEviction::ForgetStoredUnder(const std::string& model) {
  const std::string prefix = absl::StrCat(model, "/");
  std::set<std::string> keys;
  {
    absl::MutexLock lock(&mu_);
    for (StagingObject* object : residency_.Matching(prefix, /*prefix=*/true)) {
      // A commit's copy in flight is refused when it finishes (CommitPipeline).
      if (object->model != nullptr || object->copying) continue;
      // Holders keep their bytes until they release them; nobody gets them again.
      keys.insert(object->key());
      residency_.Remove(object);
    }
  }
  for (std::string& key : stored_.KeysUnder(prefix)) keys.insert(std::move(key));
  std::set<std::string> listed;  // host keys of the tier's own listed stored objects
  for (const std::string& key : keys) {
    stored_.Remove(key);
    listed.insert(stored_.HostKey(key, /*stored=*/true));
  }
  std::set<std::string> host_keys = listed;
  // The default tier's stored objects share the host cache's key space with the weights.
  if (stored_.prefix().empty()) {
    for (std::string& key : host_cache_.Keys(prefix)) host_keys.insert(std::move(key));
  }
  size_t forgotten = 0;
  for (const std::string& host_key : host_keys) {
    if (durable_store_ != nullptr) {
      // Off the disk too, so that a restart does not bring it back.
      if (absl::Status removed = durable_store_->RemoveAndWait(host_key); !removed.ok()) {
        TIERD_LOG(WARNING) << "removing the durable copy of " << host_key << ": " << removed;
      }
    }
    // A weight under the prefix is no stored object: NOT_FOUND, and it stays.
    const bool deleted = host_cache_.Delete(host_key).ok();
    if (deleted || listed.count(host_key) > 0) ++forgotten;
  }
  return forgotten;
}

}  // namespace tierd
