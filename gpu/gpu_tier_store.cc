// GpuTier's store path: reserve a staging range, the client writes it, commit copies it to the
// host tier.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/deferred_calls.h"
#include "common/log.h"
#include "gpu/gpu_tier.h"
#include "gpu/gpu_tier_internal.h"

namespace tierd {

void GpuTier::Reserve(ClientId client_id, const std::string& key, uint64_t length,
                      std::vector<TensorPlacement> tensors, StorePolicy policy,
                      ReserveCallback done) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto fail = [&](absl::Status status) { DeferAnswer(deferred.calls(), std::move(done), status); };
  Client* client = FindClientLocked(client_id);
  if (client == nullptr) return fail(ClientGone());
  absl::StatusOr<std::pair<std::string, std::string>> parts = SplitObjectKey(key);
  if (!parts.ok()) return fail(parts.status());
  if (catalog_.GetModel(parts->first).ok()) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("key ", key, ": ", parts->first,
                     " is a registered model; stored objects need a namespace of their own")));
  }
  if (length == 0) return fail(absl::InvalidArgumentError("a stored object needs a length"));
  if (policy.durable && options_.durable_store == nullptr) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("key ", key, ": this daemon keeps no durable objects")));
  }
  if (!FitsInSlab(length, pool_->largest_slab())) {
    return fail(LargerThanSlab(key, length, pool_->largest_slab()));
  }
  if (absl::Status quota = CheckStagingQuota(client->limits, client->staging_bytes, key, length);
      !quota.ok()) {
    return fail(quota);
  }
  client->staging_bytes += length;
  Client::Reservation reservation;
  reservation.key = key;
  reservation.length = length;
  reservation.tensors = std::make_shared<const std::vector<TensorPlacement>>(std::move(tensors));
  reservation.policy = policy;
  AllocateLocked(
      length,
      [this, client_id, reservation = std::move(reservation),
       done = std::move(done)](absl::StatusOr<StagingRange> range) mutable {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        Client* client = FindClientLocked(client_id);
        absl::StatusOr<uint32_t> written = !range.ok()         ? range.status()
                                           : client == nullptr ? ClientGone()
                                                               : events_.Acquire();
        if (!written.ok()) {
          if (range.ok()) pool_->Free(*range);
          if (client != nullptr) client->staging_bytes -= reservation.length;
          return DeferAnswer(later.calls(), std::move(done), written.status());
        }
        reservation.range = *range;
        reservation.written_event = *written;
        ReservationGrant grant;
        grant.reservation_id = client->next_reservation++;
        grant.key = reservation.key;
        grant.range = *range;
        grant.length = reservation.length;
        grant.written_event = *written;
        client->reservations[grant.reservation_id] = std::move(reservation);
        ++stats_.reservations;
        DeferAnswer(later.calls(), std::move(done), absl::StatusOr<ReservationGrant>(grant));
      },
      deferred.calls());
}

void GpuTier::Commit(ClientId client_id, uint64_t reservation_id, bool abort, StatusCallback done) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Client* client = FindClientLocked(client_id);
  absl::Status refused;
  if (client == nullptr) {
    refused = ClientGone();
  } else if (client->reservations.count(reservation_id) == 0) {
    refused = absl::FailedPreconditionError(
        absl::StrCat("reservation ", reservation_id,
                     " is not open in this session (never made, or already committed or aborted)"));
  }
  if (!refused.ok()) {
    return DeferAnswer(deferred.calls(), std::move(done), refused);
  }
  auto it = client->reservations.find(reservation_id);
  Client::Reservation reservation = std::move(it->second);
  client->reservations.erase(it);
  client->staging_bytes -= reservation.length;
  const uint32_t written_event = reservation.written_event;
  if (abort) {
    Drain drain;
    drain.kind = Drain::Kind::kRange;
    drain.range = reservation.range;
    StartDrainLocked(*client, std::move(drain), written_event);
    return DeferAnswer(deferred.calls(), std::move(done), absl::OkStatus());
  }
  const uint64_t commit_id = next_commit_++;
  const std::string key = reservation.key;
  const uint64_t length = reservation.length;
  // A durable object's copy on disk serves instead of a spill file.
  const bool spillable = reservation.policy.spillable && !reservation.policy.durable;
  PendingCommit& commit = commits_[commit_id];
  commit.reservation = std::move(reservation);
  commit.done = std::move(done);
  // The client's write and the host tier's room are awaited at once.
  Drain drain;
  drain.kind = Drain::Kind::kCommit;
  drain.commit = commit_id;
  StartDrainLocked(*client, std::move(drain), written_event);
  ++host_reservations_in_flight_;
  deferred.calls().push_back(
      [this, commit_id, key = HostKey(key, /*stored=*/true), length, spillable] {
        host_cache_.ReserveStore(key, length, spillable,
                                 [this, commit_id](absl::StatusOr<HostObject> host) {
                                   OnHostReservation(commit_id, std::move(host));
                                 });
      });
}

void GpuTier::OnHostReservation(uint64_t commit_id, absl::StatusOr<HostObject> host) {
  const RunningCallback running(this);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --host_reservations_in_flight_;
  auto it = commits_.find(commit_id);
  if (it == commits_.end()) {
    // The commit failed meanwhile (its client vanished); the reservation goes after the lock.
    if (host.ok())
      deferred.calls().push_back([host = *std::move(host)]() mutable { host.Reset(); });
    return;
  }
  PendingCommit& commit = it->second;
  if (host.ok()) {
    commit.host = std::make_shared<HostObject>(*std::move(host));
  } else {
    commit.host_status = host.status();
  }
  // The staging range may still be written by the client until its event completes.
  if (commit.written) {
    if (commit.host) return StartCopyOutLocked(commit_id, deferred.calls());
    return FailCommitLocked(commit_id, commit.host_status, deferred.calls());
  }
}

void GpuTier::WrittenLocked(uint64_t commit_id, Deferred& deferred) {
  auto it = commits_.find(commit_id);
  if (it == commits_.end()) return;
  it->second.written = true;
  if (it->second.host) return StartCopyOutLocked(commit_id, deferred);
  if (!it->second.host_status.ok()) {
    return FailCommitLocked(commit_id, it->second.host_status, deferred);
  }
}

void GpuTier::StartCopyOutLocked(uint64_t commit_id, Deferred& deferred) {
  PendingCommit& commit = commits_.at(commit_id);
  const Client::Reservation& reservation = commit.reservation;
  absl::StatusOr<uint32_t> ready = events_.Acquire();
  if (!ready.ok()) return FailCommitLocked(commit_id, ready.status(), deferred);
  auto object = std::make_unique<Object>();
  object->key = reservation.key;
  object->size = reservation.length;
  object->tensors = reservation.tensors;
  object->range = reservation.range;
  object->ready_event = *ready;
  object->state = Object::State::kResident;
  // The client's write has completed (its event did), so the ready event needs no wait: record it
  // first, then copy out.
  absl::Status status = device_.RecordEvent(events_.event(*ready), *store_stream_);
  if (status.ok()) {
    status = CopyChunked(*store_stream_, commit.host->data(), pool_->data(reservation.range),
                         reservation.length, /*host_is_dst=*/true);
  }
  Object* raw = object.get();
  if (status.ok()) {
    status = device_.NotifyWhenDone(*store_stream_,
                                    [this, commit_id, raw] { FinishCopyOut(commit_id, raw); });
  }
  if (!status.ok()) {
    FreeAfterStreamLocked(*store_stream_, reservation.range, *ready,
                          absl::StrCat("copying ", reservation.key, " to the host tier"), status);
    object->range.reset();
    object->ready_event.reset();
    commit.reservation.range = {};  // freed once the stream drains, not now
    commit.reservation.length = 0;
    return FailCommitLocked(
        commit_id,
        absl::Status(status.code(), absl::StrCat("copying ", reservation.key,
                                                 " to the host tier: ", status.message())),
        deferred);
  }
  ++copies_in_flight_;
  object->copying = true;
  // Published now: fetches share the staging copy while it goes to the host tier.
  if (auto old = objects_.find(object->key); old != objects_.end()) {
    Object* previous = old->second;
    UnlistLocked(previous);
    DeleteIfUnusedLocked(previous);
  }
  object->listed = true;
  objects_[raw->key] = object.release();
  TouchLocked(raw);
}

void GpuTier::FinishCopyOut(uint64_t commit_id, Object* object) {
  std::shared_ptr<HostObject> host;
  StorePolicy policy;
  std::string key;
  std::vector<TensorPlacement> tensors;
  {
    absl::MutexLock lock(&mu_);
    const PendingCommit& commit = commits_.at(commit_id);
    host = commit.host;
    policy = commit.reservation.policy;
    key = HostKey(commit.reservation.key, /*stored=*/true);
    if (policy.durable) tensors = *commit.reservation.tensors;
  }
  DurableStore* durable = options_.durable_store;
  if (policy.durable) {
    // Durable first, then published: a failed write leaves the previous version everywhere.
    const uint8_t* data = host->data();
    const uint64_t size = host->size();
    durable->Persist(std::move(key), data, size, std::move(tensors),
                     [this, commit_id, object,
                      host = std::move(host)](absl::StatusOr<DurableRecord> record) mutable {
                       absl::Status status = record.status();
                       if (status.ok()) status = host_cache_.CommitStore(*host);
                       if (status.ok()) host_cache_.SetDurableCopy(*host, *record);
                       // Let go before the answer: the store may destroy this closure later.
                       host.reset();
                       FinishCommit(commit_id, object, status);
                     });
  } else if (durable != nullptr) {
    // An older durable version goes first, after the durable store's earlier jobs for the key, so
    // that commits of a key land in order and a restart never brings back the older one.
    durable->Remove(std::move(key),
                    [this, commit_id, object, host = std::move(host)](absl::Status status) mutable {
                      if (status.ok()) status = host_cache_.CommitStore(*host);
                      host.reset();  // as above
                      FinishCommit(commit_id, object, status);
                    });
  } else {
    const absl::Status status = host_cache_.CommitStore(*host);
    host.reset();  // as above
    FinishCommit(commit_id, object, status);
  }
}

void GpuTier::FinishCommit(uint64_t commit_id, Object* object, const absl::Status& status) {
  const RunningCallback running(this);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --copies_in_flight_;
  object->copying = false;
  auto it = commits_.find(commit_id);
  PendingCommit commit = std::move(it->second);
  commits_.erase(it);
  --stats_.reservations;
  if (status.ok()) {
    stats_.bytes_gpu_to_host += object->size;
    stored_[object->key] = {object->size, object->tensors};
  } else {
    UnlistLocked(object);
  }
  // A newer commit of the key may have replaced it meanwhile.
  DeleteIfUnusedLocked(object);
  deferred.calls().push_back(
      [done = std::move(commit.done), host = std::move(commit.host), status]() mutable {
        host.reset();
        std::move(done)(status);
      });
  RetryAllocationsLocked(deferred.calls());
}

void GpuTier::AdoptStored(const std::string& key, uint64_t size,
                          std::vector<TensorPlacement> tensors) {
  absl::MutexLock lock(&mu_);
  stored_[key] = {size, std::make_shared<const std::vector<TensorPlacement>>(std::move(tensors))};
}

// `status` by value: callers pass the pending commit's own host_status, which the move below
// would empty.
void GpuTier::FailCommitLocked(uint64_t commit_id, absl::Status status, Deferred& deferred) {
  auto it = commits_.find(commit_id);
  if (it == commits_.end()) return;
  PendingCommit commit = std::move(it->second);
  commits_.erase(it);
  --stats_.reservations;
  if (commit.reservation.length > 0) pool_->Free(commit.reservation.range);
  deferred.push_back(
      [done = std::move(commit.done), host = std::move(commit.host), status]() mutable {
        host.reset();
        std::move(done)(status);
      });
}

}  // namespace tierd
