#include "server/node/host_lender.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/log.h"

namespace tierd {
namespace {

// A descriptor that becomes readable when process `pid` exits; -1 where the kernel has no
// pidfd_open (before 5.3) or refuses it.
int OpenPidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

// Whether the process a lessee was made for has exited.
bool Exited(pid_t pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd exited{pidfd, POLLIN, 0};
    return ::poll(&exited, 1, 0) > 0;
  }
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

HostLender::HostLender(Catalog& catalog, HostCache& cache, const HostArena& arena,
                       uint64_t max_lent_bytes)
    : catalog_(catalog),
      cache_(cache),
      arena_(arena),
      max_lent_bytes_(max_lent_bytes > 0 ? max_lent_bytes : arena.capacity() / 2) {}

HostLender::~HostLender() {
  {
    std::vector<HostObject> released;  // let go after the lock
    absl::MutexLock lock(&mu_);
    for (auto& [id, quarantined] : quarantined_) released.push_back(std::move(quarantined.object));
    quarantined_.clear();
    for (auto& [pid, lessee] : lessees_) {
      if (lessee.pidfd >= 0) ::close(lessee.pidfd);
    }
    lessees_.clear();
  }
  // Reads for lends still under way answer into sessions' tables, which call back here.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](uint32_t* fetching) { return *fetching == 0; }, &fetching_));
  // The timer goes first (declared last), with a check it may still have pending; that check
  // finds nothing quarantined any more.
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

uint64_t HostLender::leases_served() const {
  absl::MutexLock lock(&mu_);
  return served_;
}

uint64_t HostLender::leases_held() const {
  absl::MutexLock lock(&mu_);
  return held_ + quarantined_.size();
}

uint64_t HostLender::leases_quarantined() const {
  absl::MutexLock lock(&mu_);
  return quarantined_.size();
}

uint64_t HostLender::bytes_lent() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

absl::StatusOr<uint64_t> HostLender::SizeToLend(const std::string& key,
                                                uint64_t source_fingerprint) const {
  // Only model objects have homes; a stored object's key names no registered model.
  absl::StatusOr<ObjectRef> ref = catalog_.Lookup(key);
  if (!ref.ok()) {
    if (ref.status().code() != absl::StatusCode::kNotFound) return ref.status();
    return absl::NotFoundError(
        absl::StrCat("host leases are lent for model objects only: ", ref.status().message()));
  }
  if (source_fingerprint != 0 &&
      source_fingerprint != ObjectSourceFingerprint(*ref->model, *ref->object)) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, " comes from other files here (", ref->model->directory,
                     "): register the model from the same files on every daemon of the node"));
  }
  return ref->object->size;
}

absl::Status HostLender::Reserve(const std::string& key, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Loaned& loaned = loaned_[key];
  if (loaned.leases == 0) {
    if (bytes_ + bytes > max_lent_bytes_) {
      loaned_.erase(key);
      return absl::ResourceExhaustedError(absl::StrCat(
          "host leases hold ", FormatByteSize(bytes_), " of this daemon's host cache; ",
          FormatByteSize(bytes), " more would pass the ", FormatByteSize(max_lent_bytes_),
          " that may be lent (half the host cache)"));
    }
    loaned.bytes = bytes;
    bytes_ += bytes;
  }
  ++loaned.leases;
  return absl::OkStatus();
}

void HostLender::Unreserve(const std::string& key) {
  absl::MutexLock lock(&mu_);
  UnreserveLocked(key);
}

void HostLender::UnreserveLocked(const std::string& key) {
  auto it = loaned_.find(key);
  if (it == loaned_.end()) return;
  if (--it->second.leases > 0) return;
  bytes_ -= std::min(it->second.bytes, bytes_);
  loaned_.erase(it);
}

uint64_t HostLender::NextLeaseId() {
  absl::MutexLock lock(&mu_);
  return HostLeases::kIdBit | next_id_++;
}

void HostLender::Fetch(const std::string& key,
                       absl::AnyInvocable<void(absl::StatusOr<HostObject>) &&> done) {
  {
    absl::MutexLock lock(&mu_);
    ++fetching_;
  }
  cache_.Fetch(key, ReadPriority::kDemand, absl::InfiniteFuture(),
               [this, done = std::move(done)](absl::StatusOr<HostObject> object) mutable {
                 std::move(done)(std::move(object));
                 absl::MutexLock lock(&mu_);
                 --fetching_;
               });
}

HostLender::Held HostLender::QuarantinedFor(pid_t lessee) const {
  absl::MutexLock lock(&mu_);
  auto it = lessees_.find(lessee);
  if (it == lessees_.end()) return {};
  return Held{static_cast<uint64_t>(it->second.leases), it->second.bytes};
}

void HostLender::Lent() {
  absl::MutexLock lock(&mu_);
  ++served_;
  ++held_;
}

void HostLender::Returned(const std::string& key) {
  absl::MutexLock lock(&mu_);
  --held_;
  UnreserveLocked(key);
}

void HostLender::Quarantine(pid_t lessee, std::map<uint64_t, HostObject> leases) {
  if (leases.empty()) return;
  absl::MutexLock lock(&mu_);
  held_ -= leases.size();
  Lessee& watched = lessees_[lessee];
  if (watched.leases == 0 && watched.pidfd < 0) watched.pidfd = OpenPidfd(lessee);
  watched.leases += static_cast<int>(leases.size());
  for (auto& [id, object] : leases) {
    watched.bytes += object.size();
    quarantined_.emplace(id, Quarantined{lessee, std::move(object)});
  }
  TIERD_LOG(INFO) << "a session of process " << lessee << " ended holding " << leases.size()
                  << " host lease(s): held until that process releases them or exits";
  if (!checking_) {
    checking_ = true;
    timer_.RunAfter(kLesseeCheckPeriod, [this] { CheckLessees(); });
  }
}

HostObject HostLender::TakeQuarantinedLocked(std::map<uint64_t, Quarantined>::iterator it) {
  HostObject object = std::move(it->second.object);
  UnreserveLocked(object.key());
  auto lessee = lessees_.find(it->second.lessee);
  if (lessee != lessees_.end()) lessee->second.bytes -= object.size();
  if (lessee != lessees_.end() && --lessee->second.leases == 0) {
    if (lessee->second.pidfd >= 0) ::close(lessee->second.pidfd);
    lessees_.erase(lessee);
  }
  quarantined_.erase(it);
  return object;
}

bool HostLender::ReleaseQuarantined(uint64_t lease_id, pid_t lessee) {
  HostObject released;  // let go after the lock
  absl::MutexLock lock(&mu_);
  auto it = quarantined_.find(lease_id);
  if (it == quarantined_.end() || it->second.lessee != lessee) return false;
  released = TakeQuarantinedLocked(it);
  return true;
}

void HostLender::CheckLessees() {
  std::vector<HostObject> released;  // let go after the lock
  absl::MutexLock lock(&mu_);
  for (auto it = quarantined_.begin(); it != quarantined_.end();) {
    auto lessee = lessees_.find(it->second.lessee);
    const bool gone = lessee == lessees_.end() || Exited(lessee->first, lessee->second.pidfd);
    if (gone) {
      released.push_back(TakeQuarantinedLocked(it++));
    } else {
      ++it;
    }
  }
  if (!released.empty()) {
    TIERD_LOG(INFO) << "released " << released.size()
                    << " quarantined host lease(s) of processes that have exited";
  }
  checking_ = !quarantined_.empty();
  if (checking_) timer_.RunAfter(kLesseeCheckPeriod, [this] { CheckLessees(); });
}

void HostLeases::Lend(const std::string& key, uint64_t source_fingerprint,
                      absl::AnyInvocable<void(absl::StatusOr<HostLoan>) &&> done) {
  absl::StatusOr<uint64_t> size = lender_.SizeToLend(key, source_fingerprint);
  if (!size.ok()) return std::move(done)(size.status());
  // What the process's ended sessions left quarantined counts against this one's quota: a
  // process that ends sessions holding their leases gains nothing by opening new ones.
  const HostLender::Held left = lender_.QuarantinedFor(lessee_);
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return std::move(done)(absl::UnavailableError("the session has ended"));
    if (leases_.size() + pending_ + left.leases >= max_leases_) {
      return std::move(done)(absl::ResourceExhaustedError(
          absl::StrCat("this session holds ", leases_.size() + pending_,
                       " host leases and its process's ended "
                       "sessions ",
                       left.leases, "; together at most ", max_leases_,
                       " (the lease quota) until the process releases some")));
    }
    if (bytes_ + *size + left.bytes > max_bytes_) {
      return std::move(done)(absl::ResourceExhaustedError(
          absl::StrCat("this session holds ", FormatByteSize(bytes_),
                       " of host leases and its process's "
                       "ended sessions ",
                       FormatByteSize(left.bytes), "; ", key, " (", FormatByteSize(*size),
                       ") would pass their quota of ", FormatByteSize(max_bytes_),
                       " (--session-max-staging-bytes)")));
    }
    if (absl::Status reserved = lender_.Reserve(key, *size); !reserved.ok()) {
      return std::move(done)(reserved);
    }
    ++pending_;
    bytes_ += *size;
  }
  lender_.Fetch(key, [this, self = shared_from_this(), key, size = *size,
                      done = std::move(done)](absl::StatusOr<HostObject> object) mutable {
    HostObject unused;  // released after the lock
    absl::StatusOr<HostLoan> loan;
    {
      absl::MutexLock lock(&mu_);
      --pending_;
      if (!object.ok() || closed_) {
        bytes_ -= size;
        lender_.Unreserve(key);
        if (object.ok()) unused = *std::move(object);
        loan = object.ok() ? absl::UnavailableError("the session has ended") : object.status();
      } else {
        HostLoan made;
        made.lease_id = lender_.NextLeaseId();
        made.key = object->key();
        made.offset = static_cast<uint64_t>(object->data() - lender_.arena_.base());
        made.length = object->size();
        if (object->compressed() != nullptr) made.encoded_length = object->stored_size();
        made.checksum = lender_.catalog_.Checksum(made.key).value_or(0);
        leases_.emplace(made.lease_id, *std::move(object));
        lender_.Lent();
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
    if (auto it = leases_.find(lease_id); it != leases_.end()) {
      object = std::move(it->second);
      leases_.erase(it);
      bytes_ -= object.size();
    }
  }
  if (object.valid()) {
    lender_.Returned(object.key());
    return absl::OkStatus();
  }
  // A lease an earlier session of this process was lent, whose copies have completed now.
  if (lender_.ReleaseQuarantined(lease_id, lessee_)) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("no host lease ", lease_id & ~kIdBit, " is held"));
}

size_t HostLeases::ReleaseAll() {
  std::map<uint64_t, HostObject> held;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return 0;
    closed_ = true;
    held.swap(leases_);
  }
  const size_t count = held.size();
  // Its daemon's copies out of them may still be to come (its session broke, not it): they stay
  // put until it says they are done, or is gone.
  lender_.Quarantine(lessee_, std::move(held));
  return count;
}

}  // namespace tierd
