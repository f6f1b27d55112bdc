// HostCache's reads from below: the targets a load reads, the read submitted with its checksum
// computed as the chunks land, the check of the bytes once read, and the answers to the load's
// waiters. The rest of the cache is in host_cache.cc.
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/deferred_calls.h"
#include "common/log.h"
#include "storage/host/detail/host_cache_record.h"
#include "storage/host/host_cache.h"
#include "storage/io/read_router.h"
#include "storage/model/object_checksum.h"
#include "storage/model/streaming_checksum.h"

namespace tierd {

namespace {

using Kind = HostCacheRecord::Kind;
using State = HostCacheRecord::State;

// A failed read of a stored object's spilled copy that means the copy is gone or wrong.
bool LosesStoredObject(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss ||
         status.code() == absl::StatusCode::kNotFound;
}

}  // namespace

void HostCache::ListenLocked(Entry* entry, LandedCallback landed) {
  // A read already started with no listener tells nothing.
  if (!landed || (entry->state == State::kLoading && entry->landed == nullptr)) return;
  if (entry->landed == nullptr) entry->landed = std::make_shared<LandedListeners>();
  entry->landed->Add(std::move(landed));
}

void HostCache::StartReadLocked(Entry* entry, std::vector<ReadTarget> targets,
                                ReadPriority priority, absl::Time deadline) {
  entry->state = State::kLoading;
  ++entry->submits_pending;
  ++submits_pending_;
  const uint64_t load = ++entry->load;
  entry->checked = false;
  uint8_t* const base = arena_.data(*entry->memory) + entry->head;
  // An object store's reader does not tell what lands (its objects are hashed in one pass), and
  // an older daemon's durable record holds a whole-object checksum (hashed so, in one pass).
  std::shared_ptr<StreamingChecksum> streaming;
  if (entry->kind == Kind::kStored ? !entry->whole_object_checksum
                                   : !entry->source->model->in_object_store) {
    // Segments are told only where a fetch asked before the read started (listeners that join
    // later are told of the segments hashed after they do): a read nobody listens to pays nothing.
    StreamingChecksum::SegmentHashed segment_hashed;
    if (entry->landed != nullptr) {
      segment_hashed = [base, listeners = entry->landed](uint64_t begin, uint64_t end) {
        listeners->Tell(base + begin, begin, end);
      };
    }
    streaming =
        std::make_shared<StreamingChecksum>(base, entry->size, std::move(segment_hashed));
  }
  entry->streaming = streaming;
  ++reads_in_flight_;
  const ObjectInfo* const gathered =
      entry->kind == Kind::kWeight ? entry->source->object : nullptr;
  // Submitted outside the lock: the reader may answer at once, which re-enters FinishRead — and
  // the load may even fail and another start before the lock is back.
  mu_.Unlock();
  if (streaming != nullptr && gathered != nullptr) {
    // The gaps no read fills were zeroed (TargetsLocked): hashed as they are. Outside the lock, as
    // the listeners a segment completed by them is told of are.
    ForEachObjectGap(*gathered,
                     [&](uint64_t begin, uint64_t end) { streaming->Landed(begin, end); });
  }
  ReadRequest read{std::move(targets), priority, deadline, [this, entry](absl::Status status) {
                     // Finished on the checksum pool, off the reader thread, which goes on
                     // reading; failures too, so that joining the pool waits for every
                     // completion's answers. A demand read's goes before prefetches'.
                     bool demand;
                     {
                       absl::MutexLock lock(&mu_);
                       demand = entry->demand;
                     }
                     checksums_.Post(
                         [this, entry, status = std::move(status)]() mutable {
                           FinishRead(entry, std::move(status));
                         },
                         demand ? WorkerPool::kUrgent : WorkerPool::kNormal);
                   }};
  // A reader that keeps what it reads (the remote cache) keeps it only once it is checked.
  read.check = [this, entry] { return CheckLoadedBytes(entry); };
  if (streaming != nullptr) {
    read.landed = [base, streaming = std::move(streaming)](const uint8_t* bytes, uint64_t length) {
      const auto at = static_cast<uint64_t>(bytes - base);
      streaming->Landed(at, at + length);
    };
  }
  const ReadRouter::RequestId id = reader_->Submit(std::move(read));
  mu_.Lock();
  --entry->submits_pending;
  --submits_pending_;
  if (entry->state == State::kLoading && entry->load == load && !entry->read_id) {
    entry->read_id = id;
    // A demand fetch that came while the lock was dropped could not promote the read yet.
    if (entry->demand && priority != ReadPriority::kDemand) {
      reader_->Reprioritize(id, ReadPriority::kDemand, deadline);
    }
  }
  table_.FreeIfUnused(entry);
}

std::vector<ReadTarget> HostCache::TargetsLocked(const Entry* entry) const {
  std::vector<ReadTarget> targets;
  uint8_t* base = arena_.data(*entry->memory) + entry->head;
  if (entry->kind == Kind::kStored) {
    // A spill file holds the object from a page boundary, and the allocation is whole pages.
    targets.push_back(
        {entry->spill_path, entry->spill_offset, entry->size, base, /*aligned_window=*/true});
    return targets;
  }
  // One extent starting the object has its aligned window in the allocation (see head); gathered
  // objects go through the reader's bounce buffers.
  const std::vector<Extent>& extents = entry->source->object->extents;
  // In place only when the one extent is the whole object: the aligned window overwrites the
  // bytes after it, which in a gathered object would be a gap (zeroed below, and hashed as zeros).
  const bool in_place = extents.size() == 1 && extents[0].object_offset == 0 &&
                        extents[0].length == entry->source->object->size;
  const ModelInfo& model = *entry->source->model;
  // The memory may hold an evicted object's bytes: the gaps between gathered tensors, which no
  // read fills, must not make the checksum differ from the last read's.
  ZeroObjectGaps(*entry->source->object, base);
  for (const Extent& extent : extents) {
    const ModelFile& file = model.files[extent.file];
    ReadTarget& target = targets.emplace_back();
    target.path = file.path;
    target.offset = extent.file_offset;
    target.length = extent.length;
    target.destination = base + extent.object_offset;
    target.aligned_window = in_place;
    target.model_file = &file;  // the entry's source keeps the model alive while it loads
  }
  return targets;
}

absl::Status HostCache::CheckLoadedBytes(Entry* entry) {
  // Hashed as the bytes landed where the reader told of them all (Finish waits for the reader
  // threads' hashing to end); else now, in one pass.
  std::optional<uint64_t> streamed;
  if (entry->streaming != nullptr) streamed = entry->streaming->Finish();
  entry->streaming.reset();
  const uint8_t* const bytes = arena_.data(*entry->memory) + entry->head;
  const uint64_t checksum = streamed                       ? *streamed
                            : entry->whole_object_checksum ? WholeObjectChecksum(bytes, entry->size)
                                                           : ObjectChecksum(bytes, entry->size);
  if (streamed) checksums_while_reading_.fetch_add(1, std::memory_order_relaxed);
  entry->checked = true;
  if (entry->kind == Kind::kWeight) {
    if (std::optional<uint64_t> expected = catalog_.Checksum(entry->key()); !expected) {
      catalog_.RecordChecksum(entry->key(), checksum);
    } else if (*expected != checksum) {
      return absl::DataLossError(absl::StrFormat(
          "%s: checksum %016x differs from %016x recorded at registration or its first read; "
          "the file's bytes changed, or the store answered with other bytes",
          entry->key(), checksum, *expected));
    }
  } else if (checksum != entry->checksum) {
    return absl::DataLossError(
        absl::StrFormat("%s: its copy on disk has checksum %016x, the stored object had "
                        "%016x",
                        entry->key(), checksum, entry->checksum));
  }
  return absl::OkStatus();
}

void HostCache::FinishRead(Entry* entry, absl::Status status) {
  if (status.ok() && !entry->checked) status = CheckLoadedBytes(entry);
  // A model file changed, or (a local one) was replaced by a link since registration: every
  // object of the model is refused from now on, and the listing says why. A store's refusal
  // (PERMISSION_DENIED: an expired token, a policy still propagating) passes: the next read
  // asks again.
  if (entry->kind == Kind::kWeight &&
      (absl::IsFailedPrecondition(status) ||
       (absl::IsPermissionDenied(status) && !entry->source->model->in_object_store))) {
    catalog_.MarkStale(entry->source->model, std::string(status.message()));
  }
  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  --reads_in_flight_;
  entry->read_id.reset();
  if (status.code() == absl::StatusCode::kCancelled && entry->demand && entry->listed()) {
    // Nothing had landed: its listeners wait for the read that starts now.
    // A demand fetch came between CancelPrefetch's decision and the cancel: read after all.
    return StartReadLocked(entry, TargetsLocked(entry), ReadPriority::kDemand,
                           absl::InfiniteFuture());
  }
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kDataLoss) {
      ++stats_.checksum_failures;
      TIERD_LOG(ERROR) << status;
    }
    return FailLoadLocked(entry, status, deferred.calls());
  }
  stats_.bytes_from_disk += entry->size;
  entry->landed.reset();  // everything has landed
  entry->state = State::kResident;
  entry->demand = false;
  table_.Enqueue(entry);
  MaybeCompressLocked(entry);
  for (FetchCallback& done : entry->waiters) {
    DeferAnswer(deferred.calls(), std::move(done), RefLocked(entry));
  }
  entry->waiters.clear();
  table_.FreeIfUnused(entry);
}

void HostCache::FailLoadLocked(Entry* entry, const absl::Status& status, Deferred& deferred) {
  entry->streaming.reset();  // it points into the memory freed below
  entry->landed.reset();
  for (FetchCallback& done : entry->waiters) DeferAnswer(deferred, std::move(done), status);
  entry->waiters.clear();
  entry->demand = false;
  entry->memory.reset();
  entry->state = State::kSpilled;
  if (entry->kind == Kind::kStored && entry->listed() && !LosesStoredObject(status)) {
    // The spilled copy is still good: the object stays, on disk.
  } else {
    RemoveLocked(entry);
  }
  table_.RetryWaiters(deferred);
}

}  // namespace tierd
