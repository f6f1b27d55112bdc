#include "gpu/detail/commit_pipeline.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tierd {

CommitPipeline::CommitPipeline(const TierParts& tier, const Own& own)
    : mu_(tier.mu),
      device_(tier.device),
      catalog_(tier.catalog),
      host_cache_(own.host_cache),
      durable_store_(own.durable_store),
      pool_(tier.pool),
      store_stream_(own.store_stream),
      copier_(tier.copier),
      residency_(tier.residency),
      clients_(own.clients),
      drains_(own.drains),
      stored_(own.stored),
      callbacks_(tier.callbacks),
      stats_(tier.stats) {}

void CommitPipeline::Reserve(ClientId client_id, const std::string& key, uint64_t length,
                             std::vector<TensorPlacement> tensors, StorePolicy policy,
                             GpuReserveCallback done) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  auto fail = [&](absl::Status status) { DeferAnswer(deferred.calls(), std::move(done), status); };
  GpuClient* client = clients_.Find(client_id);
  if (client == nullptr) return fail(ClientGone());
  absl::StatusOr<std::pair<std::string, std::string>> parts = SplitObjectKey(key);
  if (!parts.ok()) return fail(parts.status());
  if (catalog_.GetModel(parts->first).ok()) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("key ", key, ": ", parts->first,
                     " is a registered model; stored objects need a namespace of their own")));
  }
  if (length == 0) return fail(absl::InvalidArgumentError("a stored object needs a length"));
  if (policy.durable && durable_store_ == nullptr) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("key ", key, ": this daemon keeps no durable objects")));
  }
  if (!FitsInSlab(length, pool_.largest_slab())) {
    return fail(LargerThanSlab(key, length, pool_.largest_slab()));
  }
  if (absl::Status quota = client->CheckStagingQuota(key, length); !quota.ok()) {
    return fail(quota);
  }
  client->staging_bytes += length;
  GpuClient::Reservation reservation;
  reservation.key = key;
  reservation.length = length;
  reservation.tensors = std::make_shared<const std::vector<TensorPlacement>>(std::move(tensors));
  reservation.policy = policy;
  residency_.Allocate(
      length,
      [this, client_id, reservation = std::move(reservation),
       done = std::move(done)](absl::StatusOr<StagingAllocation> memory) mutable {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        GpuClient* client = clients_.Find(client_id);
        const absl::Status granted = !memory.ok()        ? memory.status()
                                     : client == nullptr ? ClientGone()
                                                         : absl::OkStatus();
        if (!granted.ok()) {
          // The range, if any, goes back to the pool with `memory`.
          if (client != nullptr) client->staging_bytes -= reservation.length;
          return DeferAnswer(later.calls(), std::move(done), granted);
        }
        reservation.range = *std::move(memory);
        ReservationGrant grant;
        grant.reservation_id = client->next_reservation++;
        grant.key = reservation.key;
        grant.range = reservation.range.range();
        grant.length = reservation.length;
        client->reservations[grant.reservation_id] = std::move(reservation);
        ++stats_.reservations;
        DeferAnswer(later.calls(), std::move(done), absl::StatusOr<ReservationGrant>(grant));
      },
      deferred.calls());
}

void CommitPipeline::Commit(ClientId client_id, uint64_t reservation_id, bool abort,
                            std::optional<uint32_t> written_event, GpuStatusCallback done) {
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  GpuClient* client = clients_.Find(client_id);
  if (client == nullptr) return DeferAnswer(deferred.calls(), std::move(done), ClientGone());
  if (written_event) {
    if (absl::Status own = client->CheckDoneEvent(*written_event); !own.ok()) {
      return DeferAnswer(deferred.calls(), std::move(done), own);
    }
  }
  absl::StatusOr<GpuClient::Reservation> taken = clients_.TakeReservation(*client, reservation_id);
  if (!taken.ok()) return DeferAnswer(deferred.calls(), std::move(done), taken.status());
  GpuClient::Reservation reservation = *std::move(taken);
  if (abort) {
    Abandon(*client, std::move(reservation), written_event, deferred.calls());
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
  std::vector<uint32_t> wait_on;
  if (written_event) wait_on.push_back(*written_event);
  drains_.Start(
      *client, std::move(wait_on), {},
      [this, commit_id](bool forced, Deferred& deferred)
          ABSL_NO_THREAD_SAFETY_ANALYSIS {  // runs under the tier's lock
            if (forced) {
              FailCommit(commit_id, ClientGone(), deferred);
            } else {
              Written(commit_id, deferred);
            }
          },
      deferred.calls());
  ++host_reservations_in_flight_;
  deferred.calls().push_back(
      [this, commit_id, key = stored_.HostKey(key, /*stored=*/true), length, spillable] {
        host_cache_.ReserveStore(key, length, spillable,
                                 [this, commit_id](absl::StatusOr<HostObject> host) {
                                   OnHostReservation(commit_id, std::move(host));
                                 });
      });
}

void CommitPipeline::Abandon(GpuClient& client, GpuClient::Reservation reservation,
                             std::optional<uint32_t> written_event, Deferred& deferred) {
  mu_.AssertHeld();
  std::vector<uint32_t> wait_on;
  if (written_event) wait_on.push_back(*written_event);
  drains_.Start(
      client, std::move(wait_on), {},
      [this, reservation = std::move(reservation)](bool, Deferred&)
          ABSL_NO_THREAD_SAFETY_ANALYSIS mutable {  // runs under the tier's lock
            Abandoned(std::move(reservation));
          },
      deferred);
}

void CommitPipeline::Abandoned(GpuClient::Reservation reservation) {
  mu_.AssertHeld();
  reservation.range.reset();
  --stats_.reservations;
}

bool CommitPipeline::idle() const {
  mu_.AssertHeld();
  return commits_.empty() && host_reservations_in_flight_ == 0;
}

void CommitPipeline::OnHostReservation(uint64_t commit_id, absl::StatusOr<HostObject> host) {
  const RunningCallbacks::Scope running(callbacks_);
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
    if (commit.host) return StartCopyOut(commit_id, deferred.calls());
    return FailCommit(commit_id, commit.host_status, deferred.calls());
  }
}

void CommitPipeline::Written(uint64_t commit_id, Deferred& deferred) {
  auto it = commits_.find(commit_id);
  if (it == commits_.end()) return;
  it->second.written = true;
  if (it->second.host) return StartCopyOut(commit_id, deferred);
  if (!it->second.host_status.ok()) {
    return FailCommit(commit_id, it->second.host_status, deferred);
  }
}

void CommitPipeline::StartCopyOut(uint64_t commit_id, Deferred& deferred) {
  PendingCommit& commit = commits_.at(commit_id);
  GpuClient::Reservation& reservation = commit.reservation;
  const StagingRange range = reservation.range.range();
  StagingObject* object = residency_.Create(reservation.key);
  object->size = reservation.length;
  object->tensors = reservation.tensors;
  object->memory = std::move(reservation.range);
  // The client's write has completed (its event did): readers need no ready event.
  object->state = StagingObject::State::kResident;
  absl::Status status = copier_.CopyChunked(store_stream_, commit.host->data(), pool_.data(range),
                                            reservation.length, /*host_is_dst=*/true);
  if (status.ok()) {
    status = device_.NotifyWhenDone(
        store_stream_, [this, commit_id, object] { FinishCopyOut(commit_id, object); });
  }
  if (!status.ok()) {
    // Freed once the stream drains, not now.
    residency_.FreeAfterStream(store_stream_, *std::move(object->memory), std::nullopt,
                               absl::StrCat("copying ", reservation.key, " to the host tier"),
                               status);
    object->memory.reset();
    object->ready_event.reset();
    residency_.Remove(object);
    return FailCommit(
        commit_id,
        absl::Status(status.code(), absl::StrCat("copying ", reservation.key,
                                                 " to the host tier: ", status.message())),
        deferred);
  }
  residency_.CopyStarted();
  object->copying = true;
  // Published now: fetches share the staging copy while it goes to the host tier.
  residency_.Replace(object);
}

void CommitPipeline::FinishCopyOut(uint64_t commit_id, StagingObject* object) {
  std::shared_ptr<HostObject> host;
  StorePolicy policy;
  std::string key;
  std::vector<TensorPlacement> tensors;
  {
    absl::MutexLock lock(&mu_);
    const PendingCommit& commit = commits_.at(commit_id);
    host = commit.host;
    policy = commit.reservation.policy;
    key = stored_.HostKey(commit.reservation.key, /*stored=*/true);
    if (policy.durable) tensors = *commit.reservation.tensors;
  }
  if (catalog_.InModelNamespace(object->key())) {
    // Registered while the copy ran: neither published nor made durable (FinishCommit says why).
    host.reset();
    return FinishCommit(commit_id, object, absl::OkStatus());
  }
  if (policy.durable) {
    // Durable first, then published: a failed write leaves the previous version everywhere.
    const uint8_t* data = host->data();
    const uint64_t size = host->size();
    durable_store_->Persist(std::move(key), data, size, std::move(tensors),
                            [this, commit_id, object,
                             host = std::move(host)](absl::StatusOr<DurableRecord> record) mutable {
                              absl::Status status = record.status();
                              if (status.ok()) status = host_cache_.CommitStore(*host);
                              if (status.ok()) host_cache_.SetDurableCopy(*host, *record);
                              // Let go before the answer: the store may destroy this closure
                              // later.
                              host.reset();
                              FinishCommit(commit_id, object, status);
                            });
  } else if (durable_store_ != nullptr) {
    // An older durable version goes first, after the durable store's earlier jobs for the key, so
    // that commits of a key land in order and a restart never brings back the older one.
    durable_store_->Remove(std::move(key), [this, commit_id, object,
                                            host = std::move(host)](absl::Status status) mutable {
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

void CommitPipeline::FinishCommit(uint64_t commit_id, StagingObject* object, absl::Status status) {
  const RunningCallbacks::Scope running(callbacks_);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  if (status.ok() && catalog_.InModelNamespace(object->key())) {
    // The model was registered while the object was on its way: the key names its weights now,
    // and what this commit put in the host tier and on disk goes again.
    status = absl::FailedPreconditionError(absl::StrCat(
        object->key(), ": its namespace became a registered model while it was stored"));
    deferred.calls().push_back([this, host_key = stored_.HostKey(object->key(), true)] {
      (void)host_cache_.Delete(host_key);
      if (durable_store_ != nullptr) durable_store_->Remove(host_key, [](absl::Status) {});
    });
  }
  residency_.CopyFinished();
  object->copying = false;
  auto it = commits_.find(commit_id);
  PendingCommit commit = std::move(it->second);
  commits_.erase(it);
  --stats_.reservations;
  if (status.ok()) {
    stats_.bytes_gpu_to_host += object->size;
    stored_.Publish(object->key(), {object->size, object->tensors});
    // A newer commit of the key may have replaced it meanwhile.
    residency_.FreeIfUnused(object);
  } else {
    residency_.Remove(object);
  }
  deferred.calls().push_back(
      [done = std::move(commit.done), host = std::move(commit.host), status]() mutable {
        host.reset();
        std::move(done)(status);
      });
  residency_.RetryAllocations(deferred.calls());
}

// `status` by value: callers pass the pending commit's own host_status, which the move below
// would empty.
void CommitPipeline::FailCommit(uint64_t commit_id, absl::Status status, Deferred& deferred) {
  auto it = commits_.find(commit_id);
  if (it == commits_.end()) return;
  PendingCommit commit = std::move(it->second);
  commits_.erase(it);
  --stats_.reservations;
  // The reservation's range, unless a copy out took it, goes back to the pool with `commit`.
  deferred.push_back(
      [done = std::move(commit.done), host = std::move(commit.host), status]() mutable {
        host.reset();
        std::move(done)(status);
      });
}

}  // namespace tierd
