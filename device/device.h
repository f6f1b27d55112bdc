// The device layer: every GPU (or GPU-like) operation tierd performs goes through `Device`, in the
// spirit of leveldb's `Env`. `CudaDevice` is production; `HostDevice` emulates the same semantics
// with POSIX shared memory and threads so the daemon, protocol and clients run on a machine with no
// GPU; tests wrap either to inject faults.
//
// Two sides use the interface:
//  - the owner (the daemon) allocates exportable slabs, pins host memory, creates streams and
//    interprocess events, and enqueues copies, event records and waits;
//  - importers (clients, in other processes) open slab and event handles the owner exported and use
//    them with streams of their own.
//
// Semantics follow CUDA's: work enqueued on one stream runs in order; an event completes when the
// work enqueued on the stream before its most recent record has completed; a stream that waits on
// an event waits for the record that was most recent when the wait was enqueued; an event never
// recorded counts as complete.
//
// Thread-safety: every Device method may be called from any thread. A Stream may be used from
// several threads; ordering between their calls is the order in which the calls return.
// Objects returned by a Device must be destroyed before the Device.
#ifndef TIERD_DEVICE_DEVICE_H_
#define TIERD_DEVICE_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tierd {

// The codec's layout of a compressed object and the tables of a run of its tiles
// (codec/exponent_format.h), which DecodeAsync takes: declared only, so that the headers installed
// for the client do not carry the codec's format.
namespace codec {
struct CompressedLayout;
struct TileTables;
}  // namespace codec

// A device memory region that can be exported to other processes (owner side) or one opened from
// such an export (importer side). Destroying an owner slab frees the memory once no importer maps
// it (CUDA: the driver keeps it alive for open IPC mappings; host: the shared memory object is
// unlinked and lives until the last unmap). Destroying an importer slab closes the mapping.
class Slab {
 public:
  virtual ~Slab() = default;
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;

  // Device address of the first byte, valid in this process.
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
  // The opaque bytes another process passes to Device::OpenSlab. Stable for the slab's life.
  virtual const std::string& handle() const = 0;

 protected:
  Slab() = default;
};

// An ordered queue of device work.
class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Unique among the process's streams for its life: a stream made later never has the id of one
  // made before, even at the same address. Work on one stream runs in order; on two, it need not.
  uint64_t id() const { return id_; }

 protected:
  Stream() : id_(next_id_.fetch_add(1, std::memory_order_relaxed)) {}

 private:
  static inline std::atomic<uint64_t> next_id_{1};
  const uint64_t id_;
};

// An interprocess event: a marker recorded on a stream that this process or another one (through
// handle()) can query, wait on from a stream, or wait on from the CPU.
class Event {
 public:
  virtual ~Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // The opaque bytes another process passes to Device::OpenEvent.
  virtual const std::string& handle() const = 0;

 protected:
  Event() = default;
};

// A point in a stream's work whose time the device notes when it reaches it, for measuring how
// long the work between two such points took on the device. Local to this process.
class TimeMark {
 public:
  virtual ~TimeMark() = default;
  TimeMark(const TimeMark&) = delete;
  TimeMark& operator=(const TimeMark&) = delete;

 protected:
  TimeMark() = default;
};

enum class StreamPriority {
  kNormal,  // prefetches, stores, background work
  kHigh,    // demand fetches: scheduled ahead of kNormal work where the device allows
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // A short human-readable description, e.g. "host" or "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string Describe() const = 0;
  // The backend, as clients name it to open handles: "host" or "cuda".
  virtual const char* backend() const = 0;
  // The GPU's ordinal on the CUDA backend; 0 on the host backend.
  virtual int ordinal() const = 0;
  // Checks that the device still answers, cheaply and without waiting for queued work: for CUDA,
  // that the driver still reaches the GPU and the context has no sticky error (a GPU that fell off
  // the bus, an Xid that poisoned the context). Called periodically by the daemon's health monitor.
  // Errors: the device's, e.g. UNAVAILABLE or INTERNAL with the driver's message.
  virtual absl::Status CheckHealth() = 0;
  // Bytes of device memory AllocateSlab could still take now: on CUDA the GPU's free memory
  // (cudaMemGetInfo), on the host backend the free space of /dev/shm. Other processes allocate
  // too, so it is a bound to check a budget against, not a promise.
  // Errors: the device's (UNAVAILABLE, INTERNAL), or the failure to ask the filesystem.
  virtual absl::StatusOr<uint64_t> FreeMemoryBytes() = 0;

  // ---- Owner side -------------------------------------------------------------------------------

  // Allocates `bytes` of device memory exportable to other processes. Contents are unspecified.
  // Errors: INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED when the memory is not there.
  virtual absl::StatusOr<std::unique_ptr<Slab>> AllocateSlab(size_t bytes) = 0;

  // Page-locks [data, data + bytes) so async copies from and to it run at full speed and truly
  // asynchronously. REQUIRES: the range is not registered yet. Unregister before freeing it.
  // Errors: INVALID_ARGUMENT for a null or empty range; RESOURCE_EXHAUSTED when the OS refuses to
  // lock that much memory (RLIMIT_MEMLOCK).
  virtual absl::Status RegisterHostMemory(void* data, size_t bytes) = 0;
  // Page-locks [data, data + bytes) of memory this process may only read (mapped PROT_READ, e.g.
  // another process's shared memory), for copies out of it at full speed. The device never writes
  // to it. REQUIRES and errors as RegisterHostMemory; UNIMPLEMENTED where the device cannot
  // register read-only memory (the default): the caller then maps the memory writable and uses
  // RegisterHostMemory.
  virtual absl::Status RegisterReadOnlyHostMemory(const void* data, size_t bytes);
  // REQUIRES: `data` is the start of a range registered with RegisterHostMemory or
  // RegisterReadOnlyHostMemory, and no copy on it is still in flight.
  virtual absl::Status UnregisterHostMemory(void* data) = 0;

  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(StreamPriority priority) = 0;

  // An interprocess event that starts out complete (never recorded).
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;

  // Enqueues a copy of `bytes` from `src` to `dst` on `stream`; either side may be device memory
  // (a slab, owned or imported) or host memory (registered for full speed). Returns once the copy
  // is enqueued; the bytes move when the stream reaches it.
  // REQUIRES: both ranges stay valid until the copy completes.
  virtual absl::Status CopyAsync(Stream& stream, void* dst, const void* src, size_t bytes) = 0;
  // Enqueues `rows` copies of `width` bytes on `stream`, row r from src + r * src_pitch to
  // dst + r * dst_pitch (cudaMemcpy2DAsync), as CopyAsync does one. Errors: INVALID_ARGUMENT for a
  // null pointer, or a pitch narrower than `width` when rows > 1.
  // REQUIRES: both ranges stay valid until the copy completes.
  virtual absl::Status CopyAsync2D(Stream& stream, void* dst, size_t dst_pitch, const void* src,
                                   size_t src_pitch, size_t width, size_t rows) = 0;

  // Enqueues the decoding of tiles [first_tile, first_tile + tile_count) of a compressed object
  // (codec/exponent_format.h) on `stream`, as CopyAsync enqueues a copy. `tables` are those tiles'
  // tables (their checksums and escape starts 4-byte aligned) and `tiles` their data, first_tile's
  // first, 16-byte aligned, all in memory the device reads (a slab on CUDA); `dst` is the object's raw
  // bytes, in device memory; `layout` is what codec::ParseCompressedHeader returned for these
  // bytes. The tail byte is written when the range ends at the last tile. When a tile's escapes or
  // checksum disagree with its bytes the device stores a nonzero value at `*verdict` — host memory
  // registered with this device — by the time the stream has passed the decode: the caller zeroes
  // it before and reads it after (NotifyWhenDone); its tiles in `dst` then hold no particular
  // bytes. Errors: INVALID_ARGUMENT for tiles past the end, a null or misaligned pointer. REQUIRES:
  // every range stays valid until the decode completes.
  virtual absl::Status DecodeAsync(Stream& stream, const codec::CompressedLayout& layout,
                                   const codec::TileTables& tables, const void* tiles, void* dst,
                                   uint64_t first_tile, uint64_t tile_count, uint32_t* verdict) = 0;

  // A time mark, never recorded yet.
  virtual absl::StatusOr<std::unique_ptr<TimeMark>> CreateTimeMark() = 0;
  // Marks the current end of `stream`'s work in `mark`, replacing any earlier record.
  // REQUIRES: `mark` outlives the stream's reaching it.
  virtual absl::Status RecordTimeMark(TimeMark& mark, Stream& stream) = 0;
  // The device's time from `start` to `end`, both recorded on one stream, `start` first.
  // FAILED_PRECONDITION when either has not been recorded or not yet been reached.
  virtual absl::StatusOr<absl::Duration> TimeBetween(TimeMark& start, TimeMark& end) = 0;

  // Marks the current end of `stream`'s work in `event`, replacing any earlier record.
  virtual absl::Status RecordEvent(Event& event, Stream& stream) = 0;
  // Makes work enqueued on `stream` after this call wait until `event`'s most recent record (as of
  // this call) has completed. Does not block the calling thread.
  virtual absl::Status WaitEvent(Stream& stream, Event& event) = 0;
  // True when `event`'s most recent record has completed (or it was never recorded).
  virtual absl::StatusOr<bool> QueryEvent(Event& event) = 0;
  // Blocks the calling thread, without spinning a core, until QueryEvent would return true.
  virtual absl::Status SynchronizeEvent(Event& event) = 0;
  // Blocks the calling thread, without spinning a core, until all work enqueued so far on `stream`
  // has completed.
  virtual absl::Status SynchronizeStream(Stream& stream) = 0;
  // True when all work enqueued so far on `stream` has completed. Touches no interprocess state.
  virtual absl::StatusOr<bool> QueryStream(Stream& stream) = 0;

  // Enqueues `fn` to run in stream order: later work on `stream` waits until it returns. `fn` runs
  // on a device-owned thread and must not call back into the Device (CUDA forbids it). Meant for
  // short work, and for tests that need a stream to stall.
  virtual absl::Status LaunchHostFunction(Stream& stream, absl::AnyInvocable<void() &&> fn) = 0;

  // Runs `done` once all work enqueued on `stream` before this call has completed, without holding
  // up later work on the stream. `done` runs on the device's completion thread, one callback at a
  // time, and may call into the Device.
  virtual absl::Status NotifyWhenDone(Stream& stream, absl::AnyInvocable<void() &&> done) = 0;

  // ---- Importer side ----------------------------------------------------------------------------

  // Opens a slab exported by another process (Slab::handle()). Opening a handle this same process
  // exported is not supported by CUDA; open it only in other processes.
  // Errors: INVALID_ARGUMENT for bytes that are no handle of this backend; NOT_FOUND when the slab
  // is gone; FAILED_PRECONDITION when it belongs to another device.
  virtual absl::StatusOr<std::unique_ptr<Slab>> OpenSlab(absl::string_view handle) = 0;
  // Opens an event exported by another process (Event::handle()). Same errors as OpenSlab.
  virtual absl::StatusOr<std::unique_ptr<Event>> OpenEvent(absl::string_view handle) = 0;

 protected:
  Device() = default;
};

inline absl::Status Device::RegisterReadOnlyHostMemory(const void*, size_t) {
  return absl::UnimplementedError("this device cannot register read-only host memory");
}

}  // namespace tierd

#endif  // TIERD_DEVICE_DEVICE_H_
