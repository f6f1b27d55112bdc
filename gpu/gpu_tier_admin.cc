// GpuTier's residency controls: prefetch, pin, evict, forget, and what it reports.
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/deferred_calls.h"
#include "common/status_macros.h"
#include "gpu/gpu_tier.h"
#include "gpu/gpu_tier_internal.h"

namespace tierd {

absl::StatusOr<bool> GpuTier::Prefetch(const std::string& key, absl::Time deadline,
                                       bool host_only) {
  if (host_only) {
    ASSIGN_OR_RETURN(const std::string host_key, OwnHostKey(key));
    const bool resident = host_cache_.IsResident(host_key);
    RETURN_IF_ERROR(host_cache_.Prefetch(host_key, deadline));
    return !resident;
  }
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  if (Object* object = FindListedLocked(key); object != nullptr) {
    TouchLocked(object);
    return false;
  }
  RETURN_IF_ERROR(
      StartLoadLocked(key, ReadPriority::kPrefetch, deadline, deferred.calls()).status());
  return true;
}

void GpuTier::Pin(ClientId client_id, const std::string& key, StatusCallback done) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto answer = [&](absl::Status status) {
    DeferAnswer(deferred.calls(), std::move(done), status);
  };
  Client* client = FindClientLocked(client_id);
  if (client == nullptr) return answer(ClientGone());
  Object* object = FindListedLocked(key);
  auto record = client->pins.find(key);
  if (record != client->pins.end() && record->second.object != object) {
    return answer(absl::FailedPreconditionError(
        absl::StrCat(key, " changed since this session pinned it: unpin it, then pin it again")));
  }
  if (object == nullptr) {
    absl::StatusOr<Object*> started =
        StartLoadLocked(key, ReadPriority::kDemand, absl::InfiniteFuture(), deferred.calls());
    if (!started.ok()) return answer(started.status());
    object = *started;
  }
  if (record == client->pins.end()) {
    if (absl::Status quota =
            CheckStagingQuota(client->limits, client->staging_bytes, key, object->size);
        !quota.ok()) {
      DeleteIfUnusedLocked(object);
      return answer(quota);
    }
    client->staging_bytes += object->size;
    record = client->pins.emplace(key, Client::PinRecord{object, 0}).first;
  }
  ++record->second.count;
  ++object->pins;
  ++stats_.pins;
  if (object->state == Object::State::kResident) {
    TouchLocked(object);
    return answer(absl::OkStatus());
  }
  object->waiters.push_back({client_id, nullptr, std::move(done)});
}

absl::Status GpuTier::Unpin(ClientId client_id, const std::string& key) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Client* client = FindClientLocked(client_id);
  if (client == nullptr) return ClientGone();
  if (client->pins.count(key) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(key, " is not pinned by this session"));
  }
  UnpinLocked(*client, key, deferred.calls());
  return absl::OkStatus();
}

void GpuTier::UnpinLocked(Client& client, const std::string& key, Deferred& deferred) {
  auto record = client.pins.find(key);
  Object* object = record->second.object;
  --object->pins;
  --stats_.pins;
  if (--record->second.count == 0) {
    client.staging_bytes -= object->size;
    client.pins.erase(record);
  }
  if (object->listed) {
    TouchLocked(object);
  } else {
    DeleteIfUnusedLocked(object);
  }
  RetryAllocationsLocked(deferred);
}

absl::StatusOr<EvictResult> GpuTier::Evict(const std::string& key_or_prefix, EvictTier tier) {
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
    std::vector<Object*> matches;
    for (auto it = objects_.lower_bound(key_or_prefix);
         it != objects_.end() &&
         (prefix ? absl::StartsWith(it->first, key_or_prefix) : it->first == key_or_prefix);
         ++it) {
      matches.push_back(it->second);
    }
    for (Object* object : matches) {
      known = true;
      const bool stored = object->model == nullptr;
      if (tier == EvictTier::kHost) continue;
      if (IsEvictableLocked(object)) {
        evicted.insert(object->key);
        ++stats_.evictions;
        FreeObjectLocked(object);
      } else if (tier == EvictTier::kAll && stored && !object->copying &&
                 object->state == Object::State::kResident) {
        // Deleting a stored object: holders keep their bytes until they release them.
        evicted.insert(object->key);
        UnlistLocked(object);
        DeleteIfUnusedLocked(object);
      } else if (!prefix) {
        return absl::FailedPreconditionError(
            absl::StrCat(key_or_prefix, " is ",
                         object->leases > 0 ? absl::StrCat("leased (", object->leases, " lease(s))")
                         : object->pins > 0 ? "pinned"
                                            : "being copied",
                         " on the GPU; it can be evicted once released"));
      } else {
        skipped.insert(object->key);
      }
    }
    if (prefix) {
      for (auto it = stored_.lower_bound(key_or_prefix);
           it != stored_.end() && absl::StartsWith(it->first, key_or_prefix); ++it) {
        host_keys.insert(it->first);
      }
    } else {
      known = known || stored_.count(key_or_prefix) > 0;
    }
  }
  if (prefix) {
    // The default tier acts on everything the host cache lists under the prefix; a client group's
    // tier on model weights only (its own stored objects were listed from stored_ above).
    for (std::string& key : host_cache_.Keys(key_or_prefix)) {
      if (options_.stored_key_prefix.empty() || catalog_.Lookup(key).ok()) {
        host_keys.insert(std::move(key));
      }
    }
  } else {
    host_keys.insert(key_or_prefix);
    known = known || catalog_.Lookup(key_or_prefix).ok();
  }
  if (tier != EvictTier::kGpu) {
    for (const std::string& key : host_keys) {
      bool stored;
      {
        absl::MutexLock lock(&mu_);
        stored = stored_.count(key) > 0;
        if (tier == EvictTier::kAll && stored) stored_.erase(key);
      }
      if (!stored && !options_.stored_key_prefix.empty() && !catalog_.Lookup(key).ok()) {
        continue;  // another group's object (see OwnHostKey)
      }
      const std::string host_key = HostKey(key, stored);
      const bool resident = host_cache_.IsResident(host_key);
      const bool deleting = tier == EvictTier::kAll && stored;
      if (deleting && options_.durable_store != nullptr) {
        // Off the disk before the answer, so that a restart cannot bring it back.
        RETURN_IF_ERROR(options_.durable_store->RemoveAndWait(host_key));
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

void GpuTier::ForgetModel(const std::string& model) {
  const std::string prefix = absl::StrCat(model, "/");
  {
    absl::MutexLock lock(&mu_);
    std::vector<Object*> matches;
    for (auto it = objects_.lower_bound(prefix);
         it != objects_.end() && absl::StartsWith(it->first, prefix); ++it) {
      if (it->second->model != nullptr) matches.push_back(it->second);
    }
    for (Object* object : matches) {
      UnlistLocked(object);
      DeleteIfUnusedLocked(object);
    }
  }
  // The host cache's copies go too; one still in use is freed when its holder lets go.
  for (const std::string& key : host_cache_.Keys(prefix)) (void)host_cache_.Evict(key);
}

bool GpuTier::IsOnGpu(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  return it != objects_.end() && it->second->state == Object::State::kResident;
}

GpuTierStats GpuTier::stats() const {
  absl::MutexLock lock(&mu_);
  GpuTierStats stats = stats_;
  stats.budget_bytes = pool_->capacity();
  stats.used_bytes = pool_->used_bytes();
  stats.objects = objects_.size();
  stats.copies_in_flight = copies_in_flight_;
  stats.allocation_waiters = allocation_waiters_.size();
  stats.clients = OpenClientsLocked();
  stats.slabs = pool_->slab_count();
  stats.events = events_.size();
  return stats;
}

bool GpuTier::device_may_never_idle() const {
  absl::MutexLock lock(&mu_);
  return abandoned_waits_ > 0;
}

HandleList GpuTier::Handles() const { return {pool_->Slabs(), events_.Events()}; }

}  // namespace tierd
