// The disk reader's parts shared by the reader (storage/io/disk_reader.cc) and its threads
// (detail/disk_reader_worker.h): an open file, a request and the chunk a thread reads of it.
//
// Internal to storage/io. Guarded as DiskReader says: a request's cursor and counts by the reader's
// lock; a chunk belongs to the thread that took it.
#ifndef TIERD_STORAGE_IO_DETAIL_DISK_READER_PARTS_H_
#define TIERD_STORAGE_IO_DETAIL_DISK_READER_PARTS_H_

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "storage/io/disk_reader.h"
#include "storage/read_request.h"

namespace tierd {
namespace disk_reader_internal {

inline constexpr uint64_t kAlignment = kDiskReadAlignment;
// A chunk of which less than 3/4 is wanted is sparse (Chunk::sparse).
inline constexpr uint64_t kSparseNumerator = 3;
inline constexpr uint64_t kSparseDenominator = 4;

inline uint64_t AlignDown(uint64_t value) { return value / kAlignment * kAlignment; }
inline uint64_t AlignUp(uint64_t value) { return AlignDown(value + kAlignment - 1); }

}  // namespace disk_reader_internal

struct DiskReader::File {
  std::string path;
  int direct_fd = -1;  // -1 when O_DIRECT could not be opened
  int buffered_fd = -1;
  // False once O_DIRECT reads of this file have failed; the descriptor stays open for reads that
  // are still in flight on it.
  std::atomic<bool> use_direct{false};
  // Its pages are memory (tmpfs, ramfs): read by the reader thread itself, in pieces
  // (detail/memory_read.h), through buffered_fd.
  bool memory_backed = false;

  ~File() {
    if (direct_fd >= 0) ::close(direct_fd);
    if (buffered_fd >= 0) ::close(buffered_fd);
  }
};

struct DiskReader::Request {
  RequestId id = 0;
  std::vector<ReadTarget> targets;
  absl::AnyInvocable<void(absl::Status) &&> done;
  absl::AnyInvocable<void(const uint8_t*, uint64_t) const> landed;  // ReadRequest::landed
  // Where the next chunk starts: targets[next_target], aligned file offset next_offset.
  size_t next_target = 0;
  uint64_t next_offset = 0;
  bool issued_all = false;
  bool started = false;
  int outstanding = 0;
  absl::Status status;

  // Skips empty targets; sets issued_all when none is left.
  void SettleCursor() {
    while (next_target < targets.size() && targets[next_target].length == 0) ++next_target;
    if (next_target == targets.size()) {
      issued_all = true;
    } else if (next_offset < disk_reader_internal::AlignDown(targets[next_target].offset)) {
      next_offset = disk_reader_internal::AlignDown(targets[next_target].offset);
    }
  }
};

struct DiskReader::Chunk {
  Request* request = nullptr;
  // The targets [target, target + targets) of the request: several when their aligned ranges
  // touch or overlap in one file (a strided shard's rows), so that no block is read twice and
  // neighbouring rows go in one read.
  const ReadTarget* target = nullptr;
  size_t targets = 1;
  uint64_t aligned_offset = 0;  // file offset of the first byte read
  uint64_t length = 0;          // bytes to read (aligned)
  uint64_t read = 0;            // bytes read so far
  uint8_t* in_place = nullptr;  // where the chunk lands when the target has an aligned window
  // Most of the chunk's blocks hold bytes no target wants (another rank's slices of a strided
  // shard): it is read through the page cache, so that the node's other readers of those blocks
  // (the other ranks' daemons) find them there instead of reading them from the device again.
  bool sparse = false;
};

namespace disk_reader_internal {

// The bytes of `target` that `chunk` read: [begin, end) of the file.
inline std::pair<uint64_t, uint64_t> WantedPart(const DiskReader::Chunk& chunk,
                                                const ReadTarget& target) {
  return {std::max(target.offset, chunk.aligned_offset),
          std::min(target.offset + target.length, chunk.aligned_offset + chunk.length)};
}

}  // namespace disk_reader_internal
}  // namespace tierd

#endif  // TIERD_STORAGE_IO_DETAIL_DISK_READER_PARTS_H_
