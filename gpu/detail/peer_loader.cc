#include "gpu/detail/peer_loader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tierd {
namespace {

// Gives a peer's object back, once, after the lock is released.
void ReleaseLater(std::shared_ptr<PeerCopy> copy, DeferredCalls::Calls& deferred) {
  deferred.push_back([copy = std::move(copy)] {
    if (copy->release) std::move(copy->release)();
  });
}

}  // namespace

PeerLoader::PeerLoader(const TierParts& tier, const Own& own)
    : mu_(tier.mu),
      device_(tier.device),
      peers_(own.peers),
      pool_(tier.pool),
      events_(tier.events),
      stream_(own.handoff_stream),
      copier_(tier.copier),
      residency_(tier.residency),
      loader_(own.loader),
      callbacks_(tier.callbacks),
      stats_(tier.stats) {}

void PeerLoader::Start(GpuClient& client, const std::string& key, GpuLeaseCallback done,
                       Deferred& deferred) {
  mu_.AssertHeld();
  StagingObject* object = residency_.Create(key);
  object->state = StagingObject::State::kFetchingPeer;
  object->demand = true;
  object->waiters.push_back({client.id, std::move(done), nullptr});
  ++client.pending_fetches;
  ++in_flight_;
  deferred.push_back([this, object, key] {
    peers_->Fetch(key, [this, object](absl::StatusOr<PeerCopy> copy) {
      OnPeerCopy(object, std::move(copy));
    });
  });
}

uint64_t PeerLoader::in_flight() const {
  mu_.AssertHeld();
  return in_flight_;
}

void PeerLoader::OnPeerCopy(StagingObject* object, absl::StatusOr<PeerCopy> copy) {
  const RunningCallbacks::Scope running(callbacks_);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --in_flight_;
  if (!copy.ok()) return loader_.FailLoad(object, copy.status(), deferred.calls());
  auto shared = std::make_shared<PeerCopy>(*std::move(copy));
  object->size = shared->size;
  object->tensors = shared->tensors;
  if (object->size == 0 || !FitsInSlab(object->size, pool_.largest_slab())) {
    ReleaseLater(shared, deferred.calls());
    return loader_.FailLoad(object,
                            object->size == 0
                                ? absl::InternalError(absl::StrCat(shared->peer, " lent ",
                                                                   object->key(), " with 0 bytes"))
                                : LargerThanSlab(object->key(), object->size, pool_.largest_slab()),
                            deferred.calls());
  }
  object->state = StagingObject::State::kAllocating;
  residency_.Allocate(
      object->size,
      [this, object, shared](absl::StatusOr<StagingAllocation> memory) mutable {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        if (!memory.ok()) {
          ReleaseLater(std::move(shared), later.calls());
          return loader_.FailLoad(object, memory.status(), later.calls());
        }
        object->memory = *std::move(memory);
        CopyFromPeer(object, std::move(shared), later.calls());
      },
      deferred.calls());
}

void PeerLoader::CopyFromPeer(StagingObject* object, std::shared_ptr<PeerCopy> copy,
                              Deferred& deferred) {
  const std::string what = absl::StrCat("copying ", object->key(), " from ", copy->peer);
  // Without a free event the copy still goes ahead, and its readers are answered once it is done.
  if (absl::StatusOr<uint32_t> ready = events_.Acquire(EventUse::kDaemonRecords); ready.ok())
    object->ready_event = *ready;
  absl::Status status;
  if (copy->ready != nullptr) status = device_.WaitEvent(stream_, *copy->ready);
  auto* dst = static_cast<uint8_t*>(pool_.data(object->memory->range()));
  const auto* src = static_cast<const uint8_t*>(copy->data);
  if (status.ok()) status = copier_.CopyInPieces(stream_, dst, src, object->size);
  if (status.ok() && object->ready_event) {
    status = device_.RecordEvent(events_.event(*object->ready_event), stream_);
  }
  if (status.ok()) {
    residency_.CopyStarted();
    object->copying = true;
    status = device_.NotifyWhenDone(stream_, [this, object, copy]() mutable {
      loader_.FinishCopyIn(object, &GpuTierStats::bytes_peer_to_gpu);
      // Last: once the peer has its lease back, nothing here touches this loader (its owner may
      // be waiting for exactly that to tear it down).
      std::move(copy->release)();
      copy->release = nullptr;
    });
    if (!status.ok()) {
      residency_.CopyFinished();
      object->copying = false;
    }
  }
  if (!status.ok()) {
    // Pieces may still be queued: the peer's buffer is given back, like our range, only once the
    // stream has run them. Where even that cannot be arranged the peer keeps its lease until our
    // session with it ends, which is safer than letting it reuse a buffer we may still read.
    absl::Status after = device_.NotifyWhenDone(stream_, [copy]() mutable {
      if (copy->release) std::move(copy->release)();
    });
    if (!after.ok()) {
      TIERD_LOG(ERROR) << what << ": " << status << "; the peer's lease is kept until this daemon's"
                       << " session with it ends: " << after;
    }
    residency_.FreeAfterStream(stream_, *std::move(object->memory), object->ready_event, what,
                               status);
    object->memory.reset();
    object->ready_event.reset();
    return loader_.FailLoad(
        object, absl::Status(status.code(), absl::StrCat(what, ": ", status.message())), deferred);
  }
  ++stats_.peer_fetches;
  if (copy->through_host) ++stats_.peer_fetches_through_host;
  if (!object->ready_event) {
    object->state = StagingObject::State::kCopying;
    return;
  }
  object->state = StagingObject::State::kResident;
  loader_.AnswerWaiters(object, absl::OkStatus(), deferred);
}

}  // namespace tierd
