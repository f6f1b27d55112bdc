#include "storage/io/detail/uring.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/posix_error.h"

namespace tierd {
namespace {

constexpr int kMaxSlots = 4096;
// One operation's most: Linux moves at most 2^31 - 4096 bytes per read or write.
constexpr uint64_t kMaxOperation = (1ull << 31) - 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<Uring>> Uring::Create(const UringOptions& options) {
  if (options.slots < 1 || options.slots > kMaxSlots ||
      (!options.fixed_buffers.empty() &&
       options.fixed_buffers.size() != static_cast<size_t>(options.slots))) {
    return absl::InvalidArgumentError("io_uring: 1..4096 slots, and no fixed buffer or one each");
  }
  std::unique_ptr<Uring> uring(new Uring(options.slots));
  struct io_uring_params params = {};
  if (options.deferred_task_work) {
    params.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
  }
  int rc = io_uring_queue_init_params(options.slots, &uring->ring_, &params);
  if (rc == -EINVAL && options.deferred_task_work) {
    rc = io_uring_queue_init(options.slots, &uring->ring_, 0);  // a kernel before 6.1
  }
  if (rc < 0) return PosixError("io_uring_queue_init", -rc);
  uring->ring_ready_ = true;
  if (!options.fixed_buffers.empty()) uring->RegisterBuffers(options.fixed_buffers);
  return uring;
}

void Uring::RegisterBuffers(const std::vector<struct iovec>& buffers) {
  if (!ring_ready_ || fixed_buffers_ || buffers.size() != transfers_.size()) return;
  if (int rc = io_uring_register_buffers(&ring_, buffers.data(), buffers.size()); rc < 0) {
    TIERD_LOG_FIRST_N(WARNING, 1)
        << "io_uring cannot register buffers (" << std::strerror(-rc)
        << "; raise the memlock limit): transferring without fixed buffers";
    return;
  }
  fixed_buffers_ = true;
  buffers_ = buffers;
}

std::unique_ptr<Uring> Uring::Synchronous(int slots) {
  return std::unique_ptr<Uring>(new Uring(std::clamp(slots, 1, kMaxSlots)));
}

Uring::Uring(int slots) : transfers_(slots) {}

Uring::~Uring() {
  if (ring_ready_) io_uring_queue_exit(&ring_);
}

bool Uring::CanStart() const {
  if (in_flight_ >= slots()) return false;
  // A ring holds as many entries as slots, and an entry of an ended transfer's successor may be
  // queued but not yet submitted: ask the ring, not only the count.
  return !ring_ready_ || io_uring_sq_space_left(&ring_) > 0;
}

void Uring::Start(int slot, const UringTransfer& transfer) {
  transfers_[slot] = transfer;
  transfers_[slot].transferred = 0;
  ++in_flight_;
  if (ring_ready_) {
    Issue(slot);
  } else {
    ended_.push_back({slot, RunSynchronously(slot)});
  }
}

void Uring::Issue(int slot) {
  const UringTransfer& t = transfers_[slot];
  // Never null: at most `slots` transfers in flight, each with at most one entry queued.
  struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  uint8_t* at = t.buffer + t.transferred;
  const unsigned length = static_cast<unsigned>(std::min(t.length - t.transferred, kMaxOperation));
  const uint64_t offset = t.offset + t.transferred;
  const bool fixed =
      fixed_buffers_ && at >= static_cast<uint8_t*>(buffers_[slot].iov_base) &&
      at + length <= static_cast<uint8_t*>(buffers_[slot].iov_base) + buffers_[slot].iov_len;
  if (t.kind == UringTransfer::Kind::kRead) {
    fixed ? io_uring_prep_read_fixed(sqe, t.fd, at, length, offset, slot)
          : io_uring_prep_read(sqe, t.fd, at, length, offset);
  } else {
    fixed ? io_uring_prep_write_fixed(sqe, t.fd, at, length, offset, slot)
          : io_uring_prep_write(sqe, t.fd, at, length, offset);
  }
  io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
}

bool Uring::Account(int slot, int result, int* error) {
  UringTransfer& t = transfers_[slot];
  *error = 0;
  if (result == -EINTR || result == -EAGAIN) {
    ++reissued_;
    return false;  // again, as it was
  }
  if (result < 0) {
    *error = result;
    return true;
  }
  if (result == 0) {
    if (t.kind == UringTransfer::Kind::kWrite) *error = -ENOSPC;
    return true;  // a read at the end of the file; a write the disk took nothing of
  }
  t.transferred += static_cast<uint64_t>(result);
  if (t.transferred >= t.length) return true;
  // Short: the rest goes again, unless a read through O_DIRECT stopped off a block boundary,
  // which only the end of the file does.
  if (t.kind == UringTransfer::Kind::kRead && t.block_bytes != 0 && result % t.block_bytes != 0) {
    return true;
  }
  ++reissued_;
  return false;
}

int Uring::RunSynchronously(int slot) {
  const UringTransfer& t = transfers_[slot];
  for (;;) {
    uint8_t* at = t.buffer + t.transferred;
    const size_t length = std::min(t.length - t.transferred, kMaxOperation);
    const off_t offset = static_cast<off_t>(t.offset + t.transferred);
    const ssize_t n = t.kind == UringTransfer::Kind::kRead ? ::pread(t.fd, at, length, offset)
                                                           : ::pwrite(t.fd, at, length, offset);
    int error;
    if (Account(slot, n < 0 ? -errno : static_cast<int>(n), &error)) return error;
  }
}

void Uring::Reap(absl::FunctionRef<void(int slot, int error)> done) {
  if (!ring_ready_) {
    std::vector<std::pair<int, int>> ended;
    ended.swap(ended_);
    in_flight_ -= static_cast<int>(ended.size());
    for (const auto& [slot, error] : ended) done(slot, error);
    return;
  }
  if (in_flight_ == 0) return;
  int rc = io_uring_submit_and_wait(&ring_, 1);
  if (rc < 0 && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN) {
    // Not expected of a healthy ring. Wait for a completion of what is in flight rather than
    // submit again in a loop: a blocked wait burns no core.
    TIERD_LOG_FIRST_N(ERROR, 5) << "io_uring_submit_and_wait: " << std::strerror(-rc);
    struct io_uring_cqe* ignored;
    io_uring_wait_cqe(&ring_, &ignored);
  }
  struct io_uring_cqe* cqe;
  while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
    const int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
    const int result = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    int error;
    if (!Account(slot, result, &error)) {
      Issue(slot);
      continue;
    }
    --in_flight_;
    done(slot, error);
  }
}

}  // namespace tierd
