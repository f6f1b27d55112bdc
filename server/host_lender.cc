#include "server/host_lender.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace tierd {

HostLender::HostLender(Catalog& catalog, HostCache& cache, const HostArena& arena)
    : catalog_(catalog), cache_(cache), arena_(arena) {}

HostLender::~HostLender() = default;  // grace_ runs what it holds at once

void HostLender::ReleaseAfterGrace(std::vector<HostObject> objects) {
  if (objects.empty()) return;
  auto held = std::make_shared<std::vector<HostObject>>(std::move(objects));
  grace_.RunAfter(kClosedSessionGrace, [held, counts = counts_] {
    counts->held.fetch_sub(static_cast<int64_t>(held->size()), std::memory_order_relaxed);
    held->clear();
  });
}

void HostLender::Lend(const std::string& key, uint64_t source_fingerprint,
                      absl::AnyInvocable<void(absl::StatusOr<HostObject>) &&> done) {
  // Only model objects have homes; a stored object's key names no registered model.
  absl::StatusOr<ObjectRef> ref = catalog_.Lookup(key);
  if (!ref.ok()) {
    absl::Status known = ref.status();
    if (known.code() == absl::StatusCode::kNotFound) {
      known = absl::NotFoundError(
          absl::StrCat("host leases are lent for model objects only: ", known.message()));
    }
    return std::move(done)(known);
  }
  if (source_fingerprint != 0 &&
      source_fingerprint != ObjectSourceFingerprint(*ref->model, *ref->object)) {
    return std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        key, " comes from other files here (", ref->model->directory,
        "): register the model from the same files on every daemon of the node")));
  }
  cache_.Fetch(key, ReadPriority::kDemand, absl::InfiniteFuture(), std::move(done));
}

v1::Handle HostLender::ArenaHandle() const {
  v1::Handle handle;
  handle.set_kind(v1::Handle::HOST_ARENA);
  handle.set_id(kArenaHandleId);
  handle.set_handle(arena_.shared_memory_name());
  handle.set_size(arena_.capacity());
  handle.set_piece_bytes(arena_.piece_bytes());
  return handle;
}

void HostLeases::Lend(const std::string& key, uint64_t source_fingerprint,
                      absl::AnyInvocable<void(absl::StatusOr<HostLoan>) &&> done) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return std::move(done)(absl::UnavailableError("the session has ended"));
    if (leases_.size() + pending_ >= max_) {
      return std::move(done)(absl::ResourceExhaustedError(
          absl::StrCat("this session holds ", max_, " host leases (its lease quota)")));
    }
    ++pending_;
  }
  lender_.Lend(key, source_fingerprint, [this, self = shared_from_this(),
                     done = std::move(done)](absl::StatusOr<HostObject> object) mutable {
    HostObject unused;  // released after the lock
    absl::StatusOr<HostLoan> loan;
    {
      absl::MutexLock lock(&mu_);
      --pending_;
      if (!object.ok()) {
        loan = object.status();
      } else if (closed_) {
        unused = *std::move(object);
        loan = absl::UnavailableError("the session has ended");
      } else {
        HostLoan made;
        made.lease_id = next_id_++;
        made.key = object->key();
        made.offset = lender_.OffsetOf(*object);
        made.length = object->size();
        made.checksum = lender_.Checksum(made.key).value_or(0);
        leases_.emplace(made.lease_id, *std::move(object));
        counts_->served.fetch_add(1, std::memory_order_relaxed);
        counts_->held.fetch_add(1, std::memory_order_relaxed);
        loan = std::move(made);
      }
    }
    unused.Reset();
    std::move(done)(std::move(loan));
  });
}

absl::Status HostLeases::Release(uint64_t lease_id) {
  HostObject object;  // released after the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) {
      return absl::NotFoundError(absl::StrCat("no host lease ", lease_id & ~kIdBit, " is held"));
    }
    object = std::move(it->second);
    leases_.erase(it);
  }
  counts_->held.fetch_sub(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

size_t HostLeases::ReleaseAll() {
  std::vector<HostObject> held;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return 0;
    closed_ = true;
    for (auto& [id, object] : leases_) held.push_back(std::move(object));
    leases_.clear();
  }
  const size_t count = held.size();
  // Its daemon's copies out of them may still run (its session broke, not it): held a while yet.
  lender_.ReleaseAfterGrace(std::move(held));
  return count;
}

}  // namespace tierd
