// The I/O engine under the disk reader and the spill writer: an io_uring ring of one thread, with
// registered (fixed) buffers and a fixed number of transfer slots, or its pread/pwrite stand-in
// where io_uring is unavailable (old kernels, seccomp).
//
// A transfer moves `length` bytes between a buffer and a descriptor at an offset. The queue sees
// each one to its end: an operation interrupted (EINTR), refused for now (EAGAIN) or cut short
// is issued again for what is left, so the caller hears of a transfer once — done, done short
// because a read met the end of the file, or failed with the errno of the operation that failed.
//
//   Uring uring = ...;                       // Uring::Create(options) or Uring::Synchronous(n)
//   while (uring.CanStart() && HaveWork()) uring.Start(free_slot, transfer);
//   uring.Reap([&](int slot, int error) { ... may Start(slot, ...) again ... });
//
// Not thread-safe: one thread drives a queue (a ring set up with deferred task work belongs to
// the thread that created it).
#ifndef TIERD_STORAGE_IO_DETAIL_URING_H_
#define TIERD_STORAGE_IO_DETAIL_URING_H_

#include <liburing.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace tierd {

struct UringTransfer {
  enum class Kind { kRead, kWrite };
  Kind kind = Kind::kRead;
  int fd = -1;
  uint8_t* buffer = nullptr;  // what a write writes is only read
  uint64_t length = 0;        // an operation moves at most 2^31 - 4096 bytes: the rest follows
  uint64_t offset = 0;
  // For reads through O_DIRECT: a read that stops short of a multiple of this has met the end of
  // the file. 0: only a read of 0 bytes has.
  uint32_t block_bytes = 0;
  // Kept by the queue: the bytes transferred so far.
  uint64_t transferred = 0;
};

struct UringOptions {
  int slots = 1;  // transfers in flight at most; 1..4096
  // Registered with the ring when it allows it (the memlock limit): slot i's transfers that lie
  // within fixed_buffers[i] then use it. Empty, or one per slot.
  std::vector<struct iovec> fixed_buffers;
  // IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN where the kernel has them (6.1+):
  // completions run when this thread reaps them, not by interrupting it. The ring is then this
  // thread's: Create it on the thread that drives it.
  bool deferred_task_work = true;
};

class Uring {
 public:
  // A ring. Errors: io_uring_queue_init's as PosixError where io_uring is unavailable (ENOSYS,
  // EPERM from seccomp, ENOMEM), INVALID_ARGUMENT for bad options. Buffers the ring cannot register
  // are logged once and used as plain buffers.
  static absl::StatusOr<std::unique_ptr<Uring>> Create(const UringOptions& options);
  // The stand-in: each Start runs its transfer to its end with pread/pwrite before it returns,
  // and Reap reports it. `slots` is clamped to 1..4096.
  static std::unique_ptr<Uring> Synchronous(int slots);

  ~Uring();  // REQUIRES: nothing in flight
  Uring(const Uring&) = delete;
  Uring& operator=(const Uring&) = delete;

  bool is_ring() const { return ring_ready_; }
  bool has_fixed_buffers() const { return fixed_buffers_; }
  int slots() const { return static_cast<int>(transfers_.size()); }
  int in_flight() const { return in_flight_; }
  // Operations issued again for what was left of a transfer (EINTR, EAGAIN, short), so far.
  uint64_t reissued() const { return reissued_; }

  // Whether another transfer may start now: fewer than `slots` in flight and room in the
  // submission queue (min(sq_space_left, slots - in flight) > 0).
  bool CanStart() const;
  // Registers `buffers` (one per slot) as UringOptions::fixed_buffers are, for a queue created
  // without them; logged once and left unregistered where the ring does not allow it. Does
  // nothing for the stand-in, or once buffers are registered. REQUIRES: nothing in flight.
  void RegisterBuffers(const std::vector<struct iovec>& buffers);
  // Starts `transfer` (its `transferred` is reset) in `slot`. REQUIRES: CanStart(); `slot` is not
  // in flight; the buffer and descriptor stay valid until the slot is reaped.
  void Start(int slot, const UringTransfer& transfer);
  // The transfer in `slot`, while in flight and when reaped.
  const UringTransfer& transfer(int slot) const { return transfers_[slot]; }

  // Submits what was started, waits for at least one transfer to end when any is in flight, and
  // calls `done(slot, error)` for each that ended: error 0 when it moved all its bytes or a read
  // met the end of the file (transferred < length), else the negative errno of the failed
  // operation (-ENOSPC for a write of no bytes). `done` may Start transfers, in its slot too.
  // Returns at once when nothing is in flight.
  void Reap(absl::FunctionRef<void(int slot, int error)> done);

 private:
  explicit Uring(int slots);
  // Queues the next operation of `slot`'s transfer: what is left of it.
  void Issue(int slot);
  // Accounts `result` of one operation of `slot`; true when its transfer has ended (with *error).
  bool Account(int slot, int result, int* error);
  // pread/pwrite until the transfer of `slot` ends; the error, or 0.
  int RunSynchronously(int slot);

  struct io_uring ring_;
  bool ring_ready_ = false;
  bool fixed_buffers_ = false;
  std::vector<struct iovec> buffers_;
  std::vector<UringTransfer> transfers_;
  int in_flight_ = 0;
  uint64_t reissued_ = 0;
  // The stand-in's transfers that ended and are not yet reaped: {slot, error}.
  std::vector<std::pair<int, int>> ended_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_DETAIL_URING_H_
