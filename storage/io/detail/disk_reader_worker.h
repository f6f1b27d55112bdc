// One disk reader thread: its I/O queue (a ring, or pread) and a bounce buffer per slot, allocated
// when a chunk first needs one. It takes chunks from the reader's queue, reads them — a
// memory-backed file's itself, in pieces (memory_read.h) — delivers them and tells the reader.
//
// Internal to storage/io. Its state is its thread's; what it shares goes through the reader.
#ifndef TIERD_STORAGE_IO_DETAIL_DISK_READER_WORKER_H_
#define TIERD_STORAGE_IO_DETAIL_DISK_READER_WORKER_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "storage/io/detail/disk_reader_parts.h"
#include "storage/io/detail/uring.h"
#include "storage/io/disk_reader.h"

namespace tierd {

class DiskReader::Worker {
 public:
  Worker(DiskReader* reader, bool use_uring) : reader_(reader), use_uring_(use_uring) {}
  ~Worker();

  // Starts the thread, which sets up its queue and buffers (a ring with deferred task work belongs
  // to the thread that creates it) and then serves; returns how the setup went.
  absl::Status Start();

 private:
  struct Slot {
    Chunk chunk;
    File* file = nullptr;
    bool direct = false;
  };

  absl::Status Init();

  // Allocates the slots' bounce buffers (registered with the ring) on the first chunk that needs
  // them: a thread that only ever reads memory-backed files has none. False when they cannot be
  // allocated.
  bool EnsureBuffers();

  uint8_t* BounceOf(int slot) const { return bounce_ + slot * reader_->options_.chunk_bytes; }
  // Where the chunk in `slot` is read to: its direct destination, or the slot's bounce buffer.
  uint8_t* BufferOf(int slot) const;

  // Takes a chunk and opens its file; false when there is no chunk.
  bool TakeChunk(bool wait, int slot);

  // Starts reading what is left of the chunk in `slot`.
  void StartRead(int slot);

  // Reads the chunk in `slot`, of a memory-backed file, and finishes it.
  void ReadFromMemory(int slot);

  // Decides what the end of `slot`'s read means: true when the chunk is finished (delivered or
  // failed), false when the rest must be read again.
  bool Finish(int slot, int error);

  void Run();

  DiskReader* const reader_;
  const bool use_uring_;
  std::unique_ptr<Uring> uring_;
  uint8_t* bounce_ = nullptr;
  std::vector<Slot> slots_;
  std::vector<int> free_slots_;
  std::thread thread_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_DETAIL_DISK_READER_WORKER_H_
