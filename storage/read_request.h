// The read contract every reader of the storage tiers speaks — the disk reader for local files,
// the remote reader for an object store's — and the host cache and the router ask: what a read
// asks for (ReadRequest: targets, a priority, a deadline, a done callback and optionally a check
// of the bytes), and what a reader does with it (Reader: Submit, Cancel, Reprioritize).
//
// Every reader serves its queued requests in one order (storage/io/detail/read_queue.h): demand
// before prefetch, then the earliest deadline, then first come.
#ifndef TIERD_STORAGE_READ_REQUEST_H_
#define TIERD_STORAGE_READ_REQUEST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "storage/model.h"

namespace tierd {

enum class ReadPriority { kDemand = 0, kPrefetch = 1 };

// How a local file is read. O_DIRECT needs offsets, lengths and buffers aligned to the device's
// logical block size; 4 KiB is a multiple of every common one. Targets of one file at most
// kMaxMergedGap apart are read as one (the gap too): the slices of a strided shard, one per row,
// are then read in large reads rather than a block at a time.
inline constexpr uint64_t kDiskReadAlignment = 4096;
inline constexpr uint64_t kMaxMergedGap = 64 << 10;

// What the disk reader reads from one file for these (offset, length) ranges, at most: each
// aligned to kDiskReadAlignment, and the gaps of up to kMaxMergedGap between them read too. What a
// request's layout costs the disk, before it is asked for (a shard's bound, storage/model/shard.h).
uint64_t DiskBytesToRead(std::vector<std::pair<uint64_t, uint64_t>> ranges);

// Bytes [offset, offset + length) of the file at `path` go to `destination`.
struct ReadTarget {
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint8_t* destination = nullptr;
  // The caller promises that the aligned superset fits around the destination: that
  // destination - offset % 4096 is 4 KiB-aligned and that the bytes from there up to
  // destination + (round_up(offset + length, 4096) - offset) may be overwritten. A reader of a
  // local file then reads straight into the destination, with no bounce copy; the bytes around
  // the range get the file's bytes there (or whatever, past the end of the file).
  bool aligned_window = false;
  // Set when `path` is a registered model file (it is then `model_file->path`): a local one is
  // opened beneath its model root without following links, and every descriptor of it must still
  // be the file registration recorded (CheckModelFile) when it is opened and before each chunk is
  // read from it; an object store's is read at its recorded version (ModelFile::etag). A file
  // replaced or modified since fails the request with that check's error. REQUIRES: outlives the
  // request.
  const ModelFile* model_file = nullptr;
};

struct ReadRequest {
  std::vector<ReadTarget> targets;
  ReadPriority priority = ReadPriority::kPrefetch;
  absl::Time deadline = absl::InfiniteFuture();
  // Called exactly once, on a reader thread (or in Cancel), when every target has been read or the
  // request failed: OK, or the first error (DATA_LOSS for a file shorter than the range or EIO,
  // NOT_FOUND / PERMISSION_DENIED for files that cannot be opened or are links where a model file
  // was registered, FAILED_PRECONDITION for a model file changed since its registration,
  // CANCELLED, UNAVAILABLE when the reader shuts down first). Must not block.
  absl::AnyInvocable<void(absl::Status) &&> done;
  // Optional: the caller's check of the bytes read (their checksum), for a reader that keeps what
  // it reads beyond the request — the RemoteReader's cache, which keeps a chunk only once a read it
  // served passed its check, and drops what it served a read that failed it (DATA_LOSS). Such a
  // reader runs it on its own thread once every target has been read, before `done`, which gets
  // its error. DiskReader keeps nothing and never runs it: its caller checks in `done`.
  absl::AnyInvocable<absl::Status()> check = nullptr;
  // Optional: told, on the reader thread that read them and before `done`, that the `length`
  // bytes at `destination` (a part of a target's range) now hold the file's bytes, so that the
  // caller can hash them while they are in that thread's cache. Called from several threads at
  // once, and in any order; must not block. What is told holds the file's bytes even when the
  // request then fails (a part of a chunk that fails is not told). DiskReader tells every part it
  // delivers (a chunk at a time; a memory-backed file's in pieces of 256 KiB, as they are read); a
  // reader that does not tell (the RemoteReader) leaves the caller to hash in `done`.
  absl::AnyInvocable<void(const uint8_t* destination, uint64_t length) const> landed = nullptr;
};

class Reader {
 public:
  using RequestId = uint64_t;
  virtual ~Reader() = default;

  // Queues `request`; its done runs once, as ReadRequest says. REQUIRES: each destination can
  // take its target's length and stays valid until done. Thread-safe.
  virtual RequestId Submit(ReadRequest request) = 0;
  // Cancels a request none of whose reads has started: its done(CANCELLED) has run when this
  // returns true. False when it has started, finished or is unknown.
  virtual bool Cancel(RequestId id) = 0;
  // Moves a request that still has reads to issue; false when there is none left to move.
  virtual bool Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline) = 0;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_READ_REQUEST_H_
