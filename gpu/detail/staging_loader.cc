#include "gpu/detail/staging_loader.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "storage/model/shard.h"

namespace tierd {
namespace {

// The host key of the whole object `shard` is cut from.
std::string WholeObjectKey(const ModelInfo& model, const ObjectInfo& shard) {
  return absl::StrCat(model.name, "/", shard.base);
}

}  // namespace

StagingLoader::StagingLoader(const TierParts& tier, const Own& own)
    : mu_(tier.mu),
      device_(tier.device),
      catalog_(tier.catalog),
      host_source_(own.host_source),
      pool_(tier.pool),
      events_(tier.events),
      demand_stream_(own.demand_stream),
      prefetch_stream_(own.prefetch_stream),
      copier_(tier.copier),
      residency_(tier.residency),
      clients_(own.clients),
      handoff_(own.handoff),
      stored_(own.stored),
      callbacks_(tier.callbacks),
      stats_(tier.stats),
      compressed_(tier.device, tier.copier, own.decode_scratch_bytes),
      check_decodes_before_serving_(own.check_decodes_before_serving),
      landed_enqueuer_(own.copy_while_reading ? std::make_unique<WorkerPool>(1) : nullptr) {}

absl::StatusOr<StagingObject*> StagingLoader::StartLoad(const std::string& key,
                                                        ReadPriority priority, absl::Time deadline,
                                                        Deferred& deferred) {
  mu_.AssertHeld();
  StagingObjectRecord record;
  // A key in a model's namespace names its weights only (never a stored object planted there).
  std::optional<StoredKeySpace::Meta> stored;
  if (!catalog_.InModelNamespace(key)) stored = stored_.Find(key);
  if (stored.has_value()) {
    record.size = stored->size;
    record.tensors = stored->tensors;
  } else {
    ASSIGN_OR_RETURN(ObjectRef ref, catalog_.Lookup(key));
    record.size = ref.object->size;
    record.tensors = ref.tensors();
    if (ref.shard != nullptr) {
      // A shard is cut out of its whole object where that reads less for the node. IsResident
      // takes the host cache's lock under the tier's: the host cache makes no call holding its own
      // (its callbacks run after it is released), so the two never wait on each other.
      const ObjectInfo* whole = FindObject(*ref.model, ref.shard->base);
      if (whole != nullptr &&
          CutShardFromObject(*ref.shard, whole->size,
                             host_source_.IsResident(WholeObjectKey(*ref.model, *ref.shard)))) {
        record.cut = ref.shard;
        record.cut_from_size = whole->size;
      }
    }
    record.model = std::move(ref.model);
  }
  if (!FitsInSlab(record.size, pool_.largest_slab())) {
    return LargerThanSlab(key, record.size, pool_.largest_slab());
  }
  record.demand = priority == ReadPriority::kDemand;
  record.deadline = deadline;
  // Made once the key is known to be loadable, so that a refusal leaves nothing in the table.
  StagingObject* object = residency_.Create(key);
  static_cast<StagingObjectRecord&>(*object) = std::move(record);
  residency_.List(object);
  IssueHostFetch(object, priority, deadline, deferred);
  return object;
}

void StagingLoader::Promote(StagingObject* object, absl::Time deadline, Deferred& deferred) {
  mu_.AssertHeld();
  object->demand = true;
  // Whichever answer comes first is used.
  if (object->state == StagingObject::State::kFetchingHost) {
    IssueHostFetch(object, ReadPriority::kDemand, deadline, deferred);
  }
}

void StagingLoader::IssueHostFetch(StagingObject* object, ReadPriority priority,
                                   absl::Time deadline, Deferred& deferred) {
  ++object->host_fetches;
  ++host_fetches_in_flight_;
  // The first fetch of a whole object (a shard is cut from its object's bytes once they are all
  // there) copies them on as they land.
  HostCache::LandedCallback landed;
  if (landed_enqueuer_ != nullptr && object->cut == nullptr && object->landed == nullptr &&
      !object->memory.has_value()) {
    object->landed = std::make_shared<LandedCopies>(copier_, object->size);
    landed = [this, object, copies = object->landed](const uint8_t* bytes, uint64_t begin,
                                                     uint64_t end) {
      // The object lives while its host fetch is in flight, and nothing lands after its answer.
      if (copies->unstarted()) StartLandedCopies(object, *copies);
      // The enqueue is posted, not made here: a reader thread that enqueued would wait in the
      // driver (behind other threads' enqueues on the stream, or the arena's registrations) and
      // under the copies' lock. The answer waits for the parts posted before it (below), so that
      // none outlives the host bytes it reads — but a failed read's bytes may go before its
      // answer: its copies are discarded then, and staging freed only after their stream.
      copies->Queued();
      landed_enqueuer_->Post([copies, bytes, begin, end] { copies->Landed(bytes, begin, end); });
    };
  }
  // Whichever fetch answers first (a promoted one too) waits for the parts told before it.
  std::shared_ptr<LandedCopies> copies = object->landed;
  deferred.push_back([this, object, key = HostKeyOf(object), priority, deadline,
                      landed = std::move(landed), copies = std::move(copies)]() mutable {
    host_source_.Fetch(
        key, priority, deadline,
        [this, object, copies = std::move(copies)](absl::StatusOr<HostBytes> host) {
          // Every part told before the answer is enqueued first (the enqueuing thread keeps up
          // with the reads; this waits only when it is behind).
          if (copies != nullptr) copies->AwaitQueued();
          OnHostObject(object, std::move(host));
        },
        std::move(landed));
  });
}

void StagingLoader::StartLandedCopies(StagingObject* object, LandedCopies& copies) {
  absl::MutexLock lock(&mu_);
  if (!copies.unstarted() || object->landed.get() != &copies) return;
  if (object->state != StagingObject::State::kFetchingHost || object->memory.has_value()) {
    return copies.Discard();
  }
  // Free room only: evicting, or waiting, for an object still being read is left to when it has
  // been (OnHostObject), as before.
  std::optional<StagingAllocation> memory = residency_.TakePreferredPlacement(object->key());
  if (memory.has_value() && memory->size() < object->size) memory.reset();
  if (!memory.has_value() && residency_.allocation_waiters() == 0) {
    memory = pool_.Allocate(object->size);
  }
  if (!memory.has_value()) return copies.Discard();
  object->memory = *std::move(memory);
  // Counted as a copy in flight until closed: a request waiting for room waits for this object to
  // become resident (and evictable) rather than being refused.
  residency_.CopyStarted();
  copies.Start(object->demand ? demand_stream_ : prefetch_stream_,
               pool_.data(object->memory->range()));
}

LandedCopies::Parts StagingLoader::CloseLandedCopies(StagingObject* object, bool discard) {
  if (object->landed == nullptr) return {};
  std::shared_ptr<LandedCopies> copies = std::move(object->landed);
  object->landed.reset();
  if (discard) copies->Discard();
  LandedCopies::Parts copied = copies->Close();
  if (copies->stream() != nullptr) residency_.CopyFinished();
  return copied;
}

std::string StagingLoader::HostKeyOf(const StagingObject* object) const {
  return object->cut != nullptr ? WholeObjectKey(*object->model, *object->cut)
                                : stored_.HostKey(object->key(), object->model == nullptr);
}

void StagingLoader::OnHostObject(StagingObject* object, absl::StatusOr<HostBytes> host) {
  const RunningCallbacks::Scope running(callbacks_);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --host_fetches_in_flight_;
  --object->host_fetches;
  if (object->state != StagingObject::State::kFetchingHost) {
    // A promoted fetch answered first; this answer is not needed. Its reference goes after the
    // lock: releasing it can run host-cache callbacks that take the lock.
    if (host.ok())
      deferred.calls().push_back([host = *std::move(host)]() mutable { host.Reset(); });
    residency_.FreeIfUnused(object);
    return;
  }
  if (!host.ok()) {
    // What landed may have been a read that then failed its check: not used, whatever answers.
    if (object->landed != nullptr) object->landed->Discard();
    if (object->host_fetches > 0) return;  // the promoted fetch may still succeed
    if (object->cut != nullptr && absl::IsResourceExhausted(host.status())) {
      // The whole object does not fit the host tier now: the shard's own ranges may.
      object->cut.reset();
      return IssueHostFetch(object,
                            object->demand ? ReadPriority::kDemand : ReadPriority::kPrefetch,
                            object->deadline, deferred.calls());
    }
    return FailLoad(object, host.status(), deferred.calls());
  }
  if (object->cut != nullptr && host->compressed() != nullptr) {
    // The whole object is held compressed: rows cannot be cut out of it on the way. The shard is
    // read as itself (docs/COMPRESSION.md).
    deferred.calls().push_back([unused = *std::move(host)]() mutable { unused.Reset(); });
    object->cut.reset();
    return IssueHostFetch(object, object->demand ? ReadPriority::kDemand : ReadPriority::kPrefetch,
                          object->deadline, deferred.calls());
  }
  const uint64_t expected = object->cut != nullptr ? object->cut_from_size : object->size;
  if (host->size() != expected) {
    return FailLoad(
        object,
        absl::InternalError(absl::StrCat(
            "host tier has ", host->size(), " bytes of ",
            object->cut != nullptr ? WholeObjectKey(*object->model, *object->cut) : object->key(),
            ", expected ", expected)),
        deferred.calls());
  }
  if (object->memory.has_value()) {
    // Staging was taken when its first part landed.
    return CopyIn(object, *std::move(host), deferred.calls());
  }
  object->state = StagingObject::State::kAllocating;
  if (std::optional<StagingAllocation> placed = residency_.TakePreferredPlacement(object->key());
      placed.has_value() && placed->size() >= object->size) {
    object->memory = *std::move(placed);
    return CopyIn(object, *std::move(host), deferred.calls());
  }
  auto shared_host = std::make_shared<HostBytes>(*std::move(host));
  residency_.Allocate(
      object->size,
      [this, object, shared_host](absl::StatusOr<StagingAllocation> memory) mutable {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        if (!memory.ok()) {
          later.calls().push_back(
              [shared_host = std::move(shared_host)]() mutable { shared_host.reset(); });
          return FailLoad(object, memory.status(), later.calls());
        }
        object->memory = *std::move(memory);
        HostBytes host = std::move(*shared_host);
        CopyIn(object, std::move(host), later.calls());
      },
      deferred.calls());
}

void StagingLoader::CopyIn(StagingObject* object, HostBytes host, Deferred& deferred) {
  auto shared_host = std::make_shared<HostBytes>(std::move(host));
  // The host reference goes after the lock: releasing it can run host-cache callbacks that take it.
  deferred.push_back([shared_host]() mutable { shared_host.reset(); });
  // Parts copied as they landed went on their own stream: the rest, and the ready event, follow
  // them there.
  Stream* const landed_stream = object->landed != nullptr ? object->landed->stream() : nullptr;
  const LandedCopies::Parts copied = CloseLandedCopies(object, /*discard=*/false);
  Stream& stream = landed_stream != nullptr ? *landed_stream
                   : object->demand         ? demand_stream_
                                            : prefetch_stream_;
  if (shared_host->compressed() != nullptr) {
    return CopyInCompressed(object, std::move(shared_host), stream, deferred);
  }
  // Without a free event the copy still goes ahead, and its readers are answered once it is done.
  if (absl::StatusOr<uint32_t> ready = events_.Acquire(EventUse::kDaemonRecords); ready.ok()) {
    object->ready_event = *ready;
  }
  uint8_t* staging = pool_.data(object->memory->range());
  absl::Status status;
  uint64_t copied_as_landed = object->size;
  if (object->cut != nullptr) {
    status = copier_.CopyStrided(stream, staging, shared_host->data(), object->cut->from_base,
                                 shared_host->pieces());
  } else {
    for (const auto& [begin, end] : PartsLeft(copied, object->size)) {
      copied_as_landed -= end - begin;
      status = copier_.CopyChunked(stream, staging + begin, shared_host->data() + begin,
                                   end - begin, /*host_is_dst=*/false, shared_host->pieces());
      if (!status.ok()) break;
    }
  }
  if (status.ok() && object->ready_event) {
    status = device_.RecordEvent(events_.event(*object->ready_event), stream);
  }
  if (status.ok()) {
    if (object->cut != nullptr) ++stats_.shards_cut;
    if (object->cut == nullptr) stats_.bytes_copied_as_landed += copied_as_landed;
    residency_.CopyStarted();
    object->copying = true;
    shared_host->HeldByCopy();
    status = device_.NotifyWhenDone(stream, [this, object, shared_host]() mutable {
      shared_host->Reset();  // no lock is held here
      FinishCopyIn(object, &GpuTierStats::bytes_host_to_gpu);
    });
    if (!status.ok()) {
      residency_.CopyFinished();
      object->copying = false;
    }
  }
  if (!status.ok()) return FailCopyIn(object, stream, status, deferred);
  if (!object->ready_event) {
    object->state = StagingObject::State::kCopying;
    return;
  }
  object->state = StagingObject::State::kResident;
  if (object->listed()) residency_.Enqueue(object);
  AnswerWaiters(object, absl::OkStatus(), deferred);
}

void StagingLoader::FailCopyIn(StagingObject* object, Stream& stream, const absl::Status& status,
                               Deferred& deferred) {
  residency_.FreeAfterStream(stream, *std::move(object->memory), object->ready_event,
                             absl::StrCat("copying ", object->key(), " to the GPU"), status);
  object->memory.reset();
  object->ready_event.reset();
  FailLoad(object,
           absl::Status(status.code(),
                        absl::StrCat("copying ", object->key(), " to the GPU: ", status.message())),
           deferred);
}

void StagingLoader::CopyInCompressed(StagingObject* object, std::shared_ptr<HostBytes> host,
                                     Stream& stream, Deferred& deferred) {
  // No ready event: the waiters are answered once the decode is known good (FinishDecodeIn).
  absl::StatusOr<CompressedCopies::Enqueued> enqueued =
      compressed_.Enqueue(stream, *host, pool_.data(object->memory->range()));
  absl::Status status = enqueued.status();
  if (status.ok()) {
    residency_.CopyStarted();
    object->copying = true;
    host->HeldByCopy();
    status = device_.NotifyWhenDone(
        *enqueued->done_on,
        [this, object, host, verdict = enqueued->verdict, key = HostKeyOf(object),
         compressed_bytes = host->stored_size()]() mutable {
          host->Reset();  // no lock is held here
          FinishDecodeIn(object, verdict, key, compressed_bytes);
        });
    if (!status.ok()) {
      // The decode may still write its verdict: the word is not given back. The copy stream
      // waits for the decode before the staging range is freed after it.
      residency_.CopyFinished();
      object->copying = false;
      (void)compressed_.WaitForDecodes(stream);
    }
  }
  if (!status.ok()) return FailCopyIn(object, stream, status, deferred);
  if (check_decodes_before_serving_) {
    object->state = StagingObject::State::kCopying;
    return;
  }
  // Served at once, as a raw copy is: the readers wait on a ready event after the decode.
  if (absl::StatusOr<uint32_t> ready = events_.Acquire(EventUse::kDaemonRecords); ready.ok()) {
    if (device_.RecordEvent(events_.event(*ready), *enqueued->done_on).ok()) {
      object->ready_event = *ready;
    } else {
      events_.Release(*ready);
    }
  }
  if (!object->ready_event) {
    object->state = StagingObject::State::kCopying;  // answered once the decode is done
    return;
  }
  object->state = StagingObject::State::kResident;
  if (object->listed()) residency_.Enqueue(object);
  AnswerWaiters(object, absl::OkStatus(), deferred);
}

void StagingLoader::FinishDecodeIn(StagingObject* object, uint32_t verdict,
                                   const std::string& host_key, uint64_t compressed_bytes) {
  const RunningCallbacks::Scope running(callbacks_);
  const CompressedCopies::Verdict outcome = compressed_.TakeVerdict(verdict, host_key);
  const absl::Status& checked = outcome.checked;
  if (!checked.ok()) {
    TIERD_LOG(ERROR) << checked << "; dropping the host copy";
    // Before the failure is seen (and the copy counted done): no fetch from now on gets the host
    // copy, which the next one reads again. Not under the tier's lock.
    host_source_.Distrust(host_key);
  }
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  residency_.CopyFinished();
  object->copying = false;
  stats_.decode_micros += absl::ToInt64Microseconds(outcome.decode_time);
  if (checked.ok()) {
    stats_.bytes_host_to_gpu += object->size;
    stats_.bytes_host_to_gpu_compressed += compressed_bytes;
    ++stats_.objects_decoded;
    if (object->state == StagingObject::State::kCopying) {
      object->state = StagingObject::State::kResident;
      if (object->listed()) residency_.Enqueue(object);
      AnswerWaiters(object, absl::OkStatus(), deferred.calls());
    }
  } else {
    ++stats_.decode_failures;
    // Whoever waits is told.
    if (object->state == StagingObject::State::kCopying) {
      // Unlisted, and freed now if nothing holds it.
      FailLoad(object, checked, deferred.calls());
      return residency_.RetryAllocations(deferred.calls());
    }
    // Served before the check (check_decodes_before_serving off): no new lease gets it; those
    // granted keep it until they are released. Either call frees it now if nothing holds it.
    if (object->listed()) {
      residency_.Remove(object);
    } else {
      residency_.FreeIfUnused(object);
    }
    return residency_.RetryAllocations(deferred.calls());
  }
  residency_.DropReadyEventIfUnneeded(object);
  residency_.FreeIfUnused(object);
  residency_.RetryAllocations(deferred.calls());
}

void StagingLoader::FinishCopyIn(StagingObject* object, uint64_t GpuTierStats::*bytes_moved) {
  const RunningCallbacks::Scope running(callbacks_);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  residency_.CopyFinished();
  object->copying = false;
  stats_.*bytes_moved += object->size;
  if (object->state == StagingObject::State::kCopying) {
    // Copied without a ready event: readable now.
    object->state = StagingObject::State::kResident;
    if (object->listed()) residency_.Enqueue(object);
    AnswerWaiters(object, absl::OkStatus(), deferred.calls());
  }
  residency_.DropReadyEventIfUnneeded(object);
  residency_.FreeIfUnused(object);
  residency_.RetryAllocations(deferred.calls());
}

void StagingLoader::FailLoad(StagingObject* object, const absl::Status& status,
                             Deferred& deferred) {
  mu_.AssertHeld();
  if (object->landed != nullptr) {
    Stream* const stream = object->landed->stream();
    const bool enqueued = object->landed->enqueued_any();
    CloseLandedCopies(object, /*discard=*/true);
    if (enqueued && object->memory.has_value()) {
      // Copies of what landed may still run into the range.
      residency_.FreeAfterStream(
          *stream, *std::move(object->memory), std::nullopt,
          absl::StrCat("copying ", object->key(), " to the GPU as it was read"), status);
      object->memory.reset();
    }
    residency_.RetryAllocations(deferred);
  }
  if (!object->copying) {
    object->memory.reset();
    if (object->ready_event) {
      events_.Release(*object->ready_event);
      object->ready_event.reset();
    }
  }
  object->state = StagingObject::State::kFetchingHost;  // not resident: nothing may lease it
  AnswerWaiters(object, status, deferred);
  // Pins taken while loading stay counted until their clients unpin or close; the object is no
  // longer listed, so it is freed then (now, if nothing holds it).
  residency_.Remove(object);
}

void StagingLoader::AnswerWaiters(StagingObject* object, const absl::Status& status,
                                  Deferred& deferred) {
  mu_.AssertHeld();
  std::vector<StagingObject::Waiter> waiters = std::move(object->waiters);
  object->waiters.clear();
  for (StagingObject::Waiter& waiter : waiters) {
    GpuClient* client = clients_.Find(waiter.client);
    if (waiter.lease) {
      if (client != nullptr) --client->pending_fetches;
      absl::StatusOr<LeaseGrant> grant = !status.ok() ? status
                                         : client == nullptr
                                             ? ClientGone()
                                             : Grant(*client, object, waiter.through_host);
      DeferAnswer(deferred, std::move(waiter.lease), std::move(grant));
    } else {
      // A pin that never took hold is taken back (the caller frees the object).
      if (!status.ok() && client != nullptr && clients_.DropPinOf(*client, object)) --stats_.pins;
      DeferAnswer(deferred, std::move(waiter.pin), status);
    }
  }
}

absl::StatusOr<LeaseGrant> StagingLoader::Grant(GpuClient& client, StagingObject* object,
                                                bool through_host) {
  mu_.AssertHeld();
  RETURN_IF_ERROR(client.CheckStagingQuota(object->key(), object->size));
  GpuClient::Lease lease;
  lease.object = object;
  if (through_host) {
    // The lease's own event: the bytes are where the reader looks once the tier's record of it,
    // after the copy into the handoff buffer, completes.
    ASSIGN_OR_RETURN(const uint32_t host_ready, events_.Acquire(EventUse::kDaemonRecords));
    absl::StatusOr<uint64_t> offset = handoff_.CopyOut(*object, host_ready);
    if (!offset.ok()) {
      events_.Release(host_ready);
      return offset.status();
    }
    lease.host_offset = *offset;
    lease.host_ready_event = host_ready;
  } else if (object->ready_event && object->copying) {
    // The copy into staging may still run: the reader waits for it (the object's ready event is
    // not recorded again while this lease is held).
    lease.names_ready_event = true;
  }
  LeaseGrant grant;
  if (through_host) {
    grant.ready_event = lease.host_ready_event;
  } else if (lease.names_ready_event) {
    grant.ready_event = object->ready_event;
  }
  grant.host_offset = lease.host_offset;
  grant.lease_id = clients_.AddLease(client, std::move(lease));
  ++stats_.leases;
  grant.key = object->key();
  grant.range = object->memory->range();
  grant.length = object->size;
  grant.tensors = object->tensors;
  return grant;
}

uint64_t StagingLoader::host_fetches_in_flight() const {
  mu_.AssertHeld();
  return host_fetches_in_flight_;
}

}  // namespace tierd
