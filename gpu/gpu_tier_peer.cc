// GpuTier's side of the handoff between daemons: fetches answered with a copy of a peer daemon's
// object (FetchOptions::ask_peers), and leases lent through the host handoff buffer to a peer that
// cannot read this GPU's memory (FetchOptions::through_host).
//
// The copy is ordered by events only: the handoff stream waits on the peer's ready event, copies,
// and records the lease's ready event; the client's stream waits on that. The peer's lease is
// given back from the stream's completion callback, once the copy has read the peer's buffer.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/deferred_calls.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/gpu_tier.h"
#include "gpu/gpu_tier_internal.h"

namespace tierd {
namespace {

// Gives a peer's object back, once, after the lock is released.
void ReleaseLater(std::shared_ptr<PeerCopy> copy, DeferredCalls::Calls& deferred) {
  deferred.push_back([copy = std::move(copy)] {
    if (copy->release) std::move(copy->release)();
  });
}

}  // namespace

void GpuTier::StartPeerLoadLocked(Client& client, const std::string& key, LeaseCallback done,
                                  Deferred& deferred) {
  auto* object = new Object;
  object->key = key;
  object->state = Object::State::kFetchingPeer;
  object->demand = true;
  object->waiters.push_back({client.id, std::move(done), nullptr});
  ++client.pending_fetches;
  ++peer_fetches_in_flight_;
  deferred.push_back([this, object, key] {
    options_.peers->Fetch(key, [this, object](absl::StatusOr<PeerCopy> copy) {
      OnPeerCopy(object, std::move(copy));
    });
  });
}

void GpuTier::OnPeerCopy(Object* object, absl::StatusOr<PeerCopy> copy) {
  const RunningCallback running(this);
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --peer_fetches_in_flight_;
  if (!copy.ok()) return FailLoadLocked(object, copy.status(), deferred.calls());
  auto shared = std::make_shared<PeerCopy>(*std::move(copy));
  object->size = shared->size;
  object->tensors = shared->tensors;
  if (object->size == 0 || !FitsInSlab(object->size, pool_->largest_slab())) {
    ReleaseLater(shared, deferred.calls());
    return FailLoadLocked(object,
                          object->size == 0
                              ? absl::InternalError(absl::StrCat(shared->peer, " lent ",
                                                                 object->key, " with 0 bytes"))
                              : LargerThanSlab(object->key, object->size, pool_->largest_slab()),
                          deferred.calls());
  }
  object->state = Object::State::kAllocating;
  AllocateLocked(
      object->size,
      [this, object, shared](absl::StatusOr<StagingRange> range) mutable {
        DeferredCalls later;
        absl::MutexLock relock(&mu_);
        if (!range.ok()) {
          ReleaseLater(std::move(shared), later.calls());
          return FailLoadLocked(object, range.status(), later.calls());
        }
        object->range = *range;
        CopyFromPeerLocked(object, std::move(shared), later.calls());
      },
      deferred.calls());
}

void GpuTier::CopyFromPeerLocked(Object* object, std::shared_ptr<PeerCopy> copy,
                                 Deferred& deferred) {
  const std::string what = absl::StrCat("copying ", object->key, " from ", copy->peer);
  absl::StatusOr<uint32_t> ready = events_.Acquire();
  if (!ready.ok()) {
    ReleaseLater(std::move(copy), deferred);
    return FailLoadLocked(object, ready.status(), deferred);
  }
  object->ready_event = *ready;
  Stream& stream = *handoff_stream_;
  absl::Status status = device_.WaitEvent(stream, *copy->ready);
  auto* dst = static_cast<uint8_t*>(pool_->data(*object->range));
  const auto* src = static_cast<const uint8_t*>(copy->data);
  if (status.ok()) status = CopyInPieces(stream, dst, src, object->size);
  if (status.ok()) status = device_.RecordEvent(events_.event(*ready), stream);
  if (status.ok()) {
    ++copies_in_flight_;
    object->copying = true;
    status = device_.NotifyWhenDone(stream, [this, object, copy]() mutable {
      std::move(copy->release)();
      copy->release = nullptr;
      FinishCopyIn(object, &GpuTierStats::bytes_peer_to_gpu);
    });
    if (!status.ok()) {
      --copies_in_flight_;
      object->copying = false;
    }
  }
  if (!status.ok()) {
    // Pieces may still be queued: the peer's buffer is given back, like our range, only once the
    // stream has run them. Where even that cannot be arranged the peer keeps its lease until our
    // session with it ends, which is safer than letting it reuse a buffer we may still read.
    absl::Status after = device_.NotifyWhenDone(stream, [copy]() mutable {
      if (copy->release) std::move(copy->release)();
    });
    if (!after.ok()) {
      TIERD_LOG(ERROR) << what << ": " << status << "; the peer's lease is kept until this daemon's"
                       << " session with it ends: " << after;
    }
    FreeAfterStreamLocked(stream, *object->range, object->ready_event, what, status);
    object->range.reset();
    object->ready_event.reset();
    return FailLoadLocked(
        object, absl::Status(status.code(), absl::StrCat(what, ": ", status.message())), deferred);
  }
  ++stats_.peer_fetches;
  if (copy->through_host) ++stats_.peer_fetches_through_host;
  object->state = Object::State::kResident;
  AnswerWaitersLocked(object, absl::OkStatus(), deferred);
}

absl::Status GpuTier::CopyToHandoffBufferLocked(Object* object, uint64_t host_offset,
                                                uint32_t done_event) {
  Stream& stream = *handoff_stream_;
  RETURN_IF_ERROR(device_.WaitEvent(stream, events_.event(*object->ready_event)));
  uint8_t* dst = handoff_buffer_->data() + host_offset;
  const auto* src = static_cast<const uint8_t*>(pool_->data(*object->range));
  RETURN_IF_ERROR(CopyInPieces(stream, dst, src, object->size));
  RETURN_IF_ERROR(device_.RecordEvent(events_.event(done_event), stream));
  stats_.bytes_gpu_to_host += object->size;
  return absl::OkStatus();
}

void GpuTier::FreeHandoffRangeLater(uint64_t offset, uint64_t bytes) {
  const absl::Status arranged =
      device_.NotifyWhenDone(*handoff_stream_, [live = liveness_, offset, bytes] {
        absl::MutexLock lock(&live->mu);
        if (live->tier != nullptr) live->tier->handoff_buffer_->Free(offset, bytes);
      });
  if (!arranged.ok()) {
    TIERD_LOG(ERROR) << "the device cannot say when the handoff stream is done (" << arranged
                     << "); " << bytes << " bytes of the host handoff buffer are retired";
  }
}

}  // namespace tierd
