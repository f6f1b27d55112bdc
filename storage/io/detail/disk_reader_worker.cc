#include "storage/io/detail/disk_reader_worker.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/io/detail/memory_read.h"

namespace tierd {

using disk_reader_internal::kAlignment;
using disk_reader_internal::WantedPart;

namespace {

// Copies the wanted part of a chunk from its bounce buffer to the target. DATA_LOSS when the file
// ended before the wanted bytes (it changed since the ranges were computed).
absl::Status DeliverChunk(const DiskReader::Chunk& chunk, const uint8_t* bounce);

// Reads the wanted part of each of a chunk's targets of a memory-backed file straight into the
// target, in pieces, telling the request of each as it lands. DeliverChunk's errors, and
// UNAVAILABLE for a read the kernel failed.
absl::Status ReadChunkFromMemory(const DiskReader::Chunk& chunk, const DiskReader::File& file,
                                 uint64_t* bytes_read);

absl::Status EndedEarly(const ReadTarget& target, uint64_t end, uint64_t wanted_end) {
  return absl::DataLossError(absl::StrCat(target.path, " ends at byte ", end, " but bytes up to ",
                                          wanted_end, " were expected; was it changed?"));
}

absl::Status DeliverChunk(const DiskReader::Chunk& chunk, const uint8_t* bounce) {
  for (size_t i = 0; i < chunk.targets; ++i) {
    const ReadTarget& target = chunk.target[i];
    const auto [want_begin, want_end] = WantedPart(chunk, target);
    if (chunk.aligned_offset + chunk.read < want_end) {
      return EndedEarly(target, chunk.aligned_offset + chunk.read, want_end);
    }
    if (chunk.in_place != nullptr) continue;  // already in place
    std::memcpy(target.destination + (want_begin - target.offset),
                bounce + (want_begin - chunk.aligned_offset), want_end - want_begin);
  }
  if (chunk.request->landed) {
    for (size_t i = 0; i < chunk.targets; ++i) {
      const ReadTarget& target = chunk.target[i];
      const auto [want_begin, want_end] = WantedPart(chunk, target);
      if (want_begin < want_end) {
        chunk.request->landed(target.destination + (want_begin - target.offset),
                              want_end - want_begin);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReadChunkFromMemory(const DiskReader::Chunk& chunk, const DiskReader::File& file,
                                 uint64_t* bytes_read) {
  const DiskReader::Request& request = *chunk.request;
  for (size_t i = 0; i < chunk.targets; ++i) {
    const ReadTarget& target = chunk.target[i];
    const auto [want_begin, want_end] = WantedPart(chunk, target);
    if (want_begin >= want_end) continue;
    const absl::StatusOr<uint64_t> read =
        ReadInPieces(file.buffered_fd, want_begin, want_end - want_begin,
                     target.destination + (want_begin - target.offset),
                     [&request](const uint8_t* piece, uint64_t bytes) {
                       if (request.landed) request.landed(piece, bytes);
                     });
    if (!read.ok()) {
      return absl::UnavailableError(
          absl::StrCat("reading ", file.path, ": ", read.status().message()));
    }
    *bytes_read += *read;
    if (*read < want_end - want_begin) return EndedEarly(target, want_begin + *read, want_end);
  }
  return absl::OkStatus();
}

}  // namespace

DiskReader::Worker::~Worker() {
  if (thread_.joinable()) thread_.join();
  uring_.reset();
  std::free(bounce_);
}

absl::Status DiskReader::Worker::Start() {
  std::promise<absl::Status> setup;
  std::future<absl::Status> result = setup.get_future();
  thread_ = std::thread([this, setup = std::move(setup)]() mutable {
    absl::Status status = Init();
    const bool serve = status.ok();
    setup.set_value(std::move(status));
    if (serve) Run();
  });
  return result.get();
}

absl::Status DiskReader::Worker::Init() {
  // pread reads one chunk at a time: more slots would only hold more chunks back.
  const int depth = use_uring_ ? reader_->options_.queue_depth : 1;
  slots_.resize(depth);
  for (int i = depth - 1; i >= 0; --i) free_slots_.push_back(i);
  if (!use_uring_) {
    uring_ = Uring::Synchronous(depth);
    return absl::OkStatus();
  }
  UringOptions options;
  options.slots = depth;
  absl::StatusOr<std::unique_ptr<Uring>> uring = Uring::Create(options);
  if (!uring.ok()) return uring.status();
  uring_ = *std::move(uring);
  return absl::OkStatus();
}

bool DiskReader::Worker::EnsureBuffers() {
  if (bounce_ != nullptr) return true;
  const uint64_t chunk = reader_->options_.chunk_bytes;
  bounce_ = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, chunk * slots_.size()));
  if (bounce_ == nullptr) return false;
  std::vector<struct iovec> buffers;
  for (size_t i = 0; i < slots_.size(); ++i) {
    buffers.push_back({BounceOf(static_cast<int>(i)), chunk});
  }
  uring_->RegisterBuffers(buffers);  // nothing is in flight: nothing could start without them
  return true;
}

uint8_t* DiskReader::Worker::BufferOf(int slot) const {
  const Chunk& chunk = slots_[slot].chunk;
  return chunk.in_place != nullptr ? chunk.in_place : BounceOf(slot);
}

bool DiskReader::Worker::TakeChunk(bool wait, int slot) {
  for (;;) {
    Chunk chunk;
    if (!reader_->NextChunk(wait, &chunk)) return false;
    absl::StatusOr<File*> file = reader_->OpenFile(*chunk.target);
    if (!file.ok()) {
      reader_->FinishChunk(chunk, file.status());
      continue;
    }
    if (absl::Status admitted = reader_->file_system_->BeforeRead((*file)->path); !admitted.ok()) {
      // Failed as a read the kernel failed (Finish): the next request opens it again.
      reader_->RetireFile(*file);
      reader_->FinishChunk(chunk, absl::UnavailableError(admitted.message()));
      continue;
    }
    slots_[slot] = Slot{chunk, *file, (*file)->use_direct.load() && !chunk.sparse};
    return true;
  }
}

void DiskReader::Worker::StartRead(int slot) {
  const Slot& s = slots_[slot];
  UringTransfer read;
  read.fd = s.direct ? s.file->direct_fd : s.file->buffered_fd;
  read.buffer = BufferOf(slot) + s.chunk.read;
  read.length = s.chunk.length - s.chunk.read;
  read.offset = s.chunk.aligned_offset + s.chunk.read;
  read.block_bytes = s.direct ? kAlignment : 0;
  uring_->Start(slot, read);
}

void DiskReader::Worker::ReadFromMemory(int slot) {
  const Slot& s = slots_[slot];
  uint64_t bytes_read = 0;
  const absl::Status status = ReadChunkFromMemory(s.chunk, *s.file, &bytes_read);
  reader_->NoteBytesRead(bytes_read, /*sparse=*/false);
  // A read the kernel failed, or a file that ended early: the next request opens it again.
  if (!status.ok()) reader_->RetireFile(s.file);
  reader_->FinishChunk(s.chunk, status);
}

bool DiskReader::Worker::Finish(int slot, int error) {
  Slot& s = slots_[slot];
  const uint64_t transferred = uring_->transfer(slot).transferred;
  reader_->NoteBytesRead(transferred, /*sparse=*/s.chunk.sparse);
  s.chunk.read += transferred;
  if (error == -EINVAL && s.direct) {
    // The filesystem took O_DIRECT at open but refuses it for reads (overlayfs, some FUSE).
    reader_->UseBuffered(s.file, EINVAL);
    s.direct = false;
    return false;
  }
  if (error < 0) {
    // A read the kernel failed (EIO from a failing disk, a stale handle): the next request
    // opens the file again, and the caller may retry.
    reader_->RetireFile(s.file);
    reader_->FinishChunk(s.chunk, absl::UnavailableError(absl::StrCat(
                                      "reading ", s.file->path, ": ", std::strerror(-error))));
    return true;
  }
  const absl::Status delivered = DeliverChunk(s.chunk, BounceOf(slot));
  // A file that ended early may have been cut off or replaced: the next request opens it again.
  if (!delivered.ok()) reader_->RetireFile(s.file);
  reader_->FinishChunk(s.chunk, delivered);
  return true;
}

void DiskReader::Worker::Run() {
  for (;;) {
    while (uring_->CanStart() && !free_slots_.empty()) {
      const int slot = free_slots_.back();
      if (!TakeChunk(/*wait=*/uring_->in_flight() == 0, slot)) break;
      if (slots_[slot].file->memory_backed) {
        ReadFromMemory(slot);  // done here; the slot stays free
        continue;
      }
      if (!EnsureBuffers()) {
        reader_->FinishChunk(slots_[slot].chunk,
                             absl::ResourceExhaustedError("allocating read buffers"));
        continue;
      }
      free_slots_.pop_back();
      StartRead(slot);
    }
    if (uring_->in_flight() == 0) return;  // nothing in flight and nothing to take: stopping
    uring_->Reap([this](int slot, int error) {
      if (Finish(slot, error)) {
        free_slots_.push_back(slot);
      } else {
        StartRead(slot);
      }
    });
  }
}

}  // namespace tierd
