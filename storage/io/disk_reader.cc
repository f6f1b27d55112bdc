#include "storage/io/disk_reader.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "storage/io/detail/memory_read.h"
#include "storage/io/detail/uring.h"
#include "storage/model/model_scan.h"

namespace tierd {

std::optional<IoEngine> ParseIoEngine(absl::string_view name) {
  if (name == "auto") return IoEngine::kAuto;
  if (name == "io_uring") return IoEngine::kIoUring;
  if (name == "pread") return IoEngine::kPread;
  return std::nullopt;
}

const char* IoEngineName(IoEngine engine) {
  switch (engine) {
    case IoEngine::kAuto:
      return "auto";
    case IoEngine::kIoUring:
      return "io_uring";
    case IoEngine::kPread:
      return "pread";
  }
  return "?";
}
namespace {

constexpr uint64_t kAlignment = kDiskReadAlignment;
// A chunk of which less than 3/4 is wanted is sparse (Chunk::sparse).
constexpr uint64_t kSparseNumerator = 3;
constexpr uint64_t kSparseDenominator = 4;

uint64_t AlignDown(uint64_t value) { return value / kAlignment * kAlignment; }
uint64_t AlignUp(uint64_t value) { return AlignDown(value + kAlignment - 1); }

}  // namespace

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
    } else if (next_offset < AlignDown(targets[next_target].offset)) {
      next_offset = AlignDown(targets[next_target].offset);
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

namespace {

// Copies the wanted part of a chunk from its bounce buffer to the target. DATA_LOSS when the file
// ended before the wanted bytes (it changed since the ranges were computed).
absl::Status DeliverChunk(const DiskReader::Chunk& chunk, const uint8_t* bounce);

// Reads the wanted part of each of a chunk's targets of a memory-backed file straight into the
// target, in pieces, telling the request of each as it lands. DeliverChunk's errors, and
// UNAVAILABLE for a read the kernel failed.
absl::Status ReadChunkFromMemory(const DiskReader::Chunk& chunk, const DiskReader::File& file,
                                 uint64_t* bytes_read);

}  // namespace

// One reader thread: its I/O queue (a ring, or pread) and a bounce buffer per slot, allocated when
// a chunk first needs one.
class DiskReader::Worker {
 public:
  Worker(DiskReader* reader, bool use_uring) : reader_(reader), use_uring_(use_uring) {}
  ~Worker() {
    if (thread_.joinable()) thread_.join();
    uring_.reset();
    std::free(bounce_);
  }

  // Starts the thread, which sets up its queue and buffers (a ring with deferred task work belongs
  // to the thread that creates it) and then serves; returns how the setup went.
  absl::Status Start() {
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

 private:
  struct Slot {
    Chunk chunk;
    File* file = nullptr;
    bool direct = false;
  };

  absl::Status Init() {
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

  // Allocates the slots' bounce buffers (registered with the ring) on the first chunk that needs
  // them: a thread that only ever reads memory-backed files has none. False when they cannot be
  // allocated.
  bool EnsureBuffers() {
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

  uint8_t* BounceOf(int slot) const { return bounce_ + slot * reader_->options_.chunk_bytes; }
  // Where the chunk in `slot` is read to: its direct destination, or the slot's bounce buffer.
  uint8_t* BufferOf(int slot) const {
    const Chunk& chunk = slots_[slot].chunk;
    return chunk.in_place != nullptr ? chunk.in_place : BounceOf(slot);
  }

  // Takes a chunk and opens its file; false when there is no chunk.
  bool TakeChunk(bool wait, int slot) {
    for (;;) {
      Chunk chunk;
      if (!reader_->NextChunk(wait, &chunk)) return false;
      absl::StatusOr<File*> file = reader_->OpenFile(*chunk.target);
      if (!file.ok()) {
        reader_->FinishChunk(chunk, file.status());
        continue;
      }
      if (absl::Status admitted = reader_->file_system_->BeforeRead((*file)->path);
          !admitted.ok()) {
        // Failed as a read the kernel failed (Finish): the next request opens it again.
        reader_->RetireFile(*file);
        reader_->FinishChunk(chunk, absl::UnavailableError(admitted.message()));
        continue;
      }
      slots_[slot] = Slot{chunk, *file, (*file)->use_direct.load() && !chunk.sparse};
      return true;
    }
  }

  // Starts reading what is left of the chunk in `slot`.
  void StartRead(int slot) {
    const Slot& s = slots_[slot];
    UringTransfer read;
    read.fd = s.direct ? s.file->direct_fd : s.file->buffered_fd;
    read.buffer = BufferOf(slot) + s.chunk.read;
    read.length = s.chunk.length - s.chunk.read;
    read.offset = s.chunk.aligned_offset + s.chunk.read;
    read.block_bytes = s.direct ? kAlignment : 0;
    uring_->Start(slot, read);
  }

  // Reads the chunk in `slot`, of a memory-backed file, and finishes it.
  void ReadFromMemory(int slot) {
    const Slot& s = slots_[slot];
    uint64_t bytes_read = 0;
    const absl::Status status = ReadChunkFromMemory(s.chunk, *s.file, &bytes_read);
    reader_->NoteBytesRead(bytes_read, /*sparse=*/false);
    // A read the kernel failed, or a file that ended early: the next request opens it again.
    if (!status.ok()) reader_->RetireFile(s.file);
    reader_->FinishChunk(s.chunk, status);
  }

  // Decides what the end of `slot`'s read means: true when the chunk is finished (delivered or
  // failed), false when the rest must be read again.
  bool Finish(int slot, int error) {
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

  void Run() {
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

  DiskReader* const reader_;
  const bool use_uring_;
  std::unique_ptr<Uring> uring_;
  uint8_t* bounce_ = nullptr;
  std::vector<Slot> slots_;
  std::vector<int> free_slots_;
  std::thread thread_;
};

namespace {

// The bytes of `target` that `chunk` read: [begin, end) of the file.
std::pair<uint64_t, uint64_t> WantedPart(const DiskReader::Chunk& chunk, const ReadTarget& target) {
  return {std::max(target.offset, chunk.aligned_offset),
          std::min(target.offset + target.length, chunk.aligned_offset + chunk.length)};
}

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
    const absl::StatusOr<uint64_t> read = ReadInPieces(
        file.buffered_fd, want_begin, want_end - want_begin,
        target.destination + (want_begin - target.offset),
        [&request](const uint8_t* piece, uint64_t bytes) {
          if (request.landed) request.landed(piece, bytes);
        });
    if (!read.ok()) {
      return absl::UnavailableError(absl::StrCat("reading ", file.path, ": ", read.status().message()));
    }
    *bytes_read += *read;
    if (*read < want_end - want_begin) return EndedEarly(target, want_begin + *read, want_end);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskReader>> DiskReader::Create(const DiskReaderOptions& options) {
  if (options.threads < 1 || options.queue_depth < 1 || options.queue_depth > 4096 ||
      options.chunk_bytes == 0 || options.chunk_bytes % kAlignment != 0 ||
      options.chunk_bytes > (1ull << 30)) {
    return absl::InvalidArgumentError(
        "disk reader: threads >= 1, queue depth 1..4096 and chunk size a multiple of 4 KiB up to "
        "1 GiB are required");
  }
  std::unique_ptr<DiskReader> reader(new DiskReader(options));
  bool use_uring = options.engine != IoEngine::kPread;
  for (int i = 0; i < options.threads; ++i) {
    auto worker = std::make_unique<Worker>(reader.get(), use_uring);
    absl::Status status = worker->Start();
    if (!status.ok() && use_uring && options.engine == IoEngine::kAuto &&
        status.code() != absl::StatusCode::kResourceExhausted) {
      TIERD_LOG(WARNING) << "io_uring is unavailable (" << status.message()
                         << "): reading with pread";
      use_uring = false;
      worker = std::make_unique<Worker>(reader.get(), use_uring);
      status = worker->Start();
    }
    if (!status.ok()) {
      if (options.engine == IoEngine::kIoUring) return absl::UnavailableError(status.message());
      return status;
    }
    reader->workers_.push_back(std::move(worker));
  }
  {
    absl::MutexLock lock(&reader->mu_);
    reader->stats_.engine = use_uring ? IoEngine::kIoUring : IoEngine::kPread;
  }
  return reader;
}

DiskReader::DiskReader(const DiskReaderOptions& options)
    : options_(options), file_system_(FileSystemOrDefault(options.file_system)) {}

DiskReader::~DiskReader() {
  std::vector<Request*> unstarted;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const RequestId id : queue_.TakeAll()) {
      Request* request = live_.at(id);
      request->issued_all = true;
      if (request->status.ok()) request->status = absl::UnavailableError("disk reader stopped");
      if (request->outstanding == 0) {
        live_.erase(request->id);
        unstarted.push_back(request);
      }
    }
  }
  for (Request* request : unstarted) {
    std::move(request->done)(request->status);
    delete request;
  }
  workers_.clear();  // joins: in-flight chunks finish and complete their requests
}

DiskReader::RequestId DiskReader::Submit(ReadRequest request) {
  auto r = std::make_unique<Request>();
  r->targets = std::move(request.targets);
  r->done = std::move(request.done);
  r->landed = std::move(request.landed);
  r->SettleCursor();
  absl::Status answer_now;
  {
    absl::MutexLock lock(&mu_);
    r->id = next_id_++;
    if (stopping_) {
      answer_now = absl::UnavailableError("disk reader stopped");
    } else if (!r->issued_all) {
      live_[r->id] = r.get();
      queue_.Push(r->id, request.priority, request.deadline);
      return r.release()->id;
    }
  }
  // Nothing to read, or no one left to read it.
  std::move(r->done)(answer_now);
  return r->id;
}

bool DiskReader::Cancel(RequestId id) {
  Request* request = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(id);
    if (it == live_.end() || it->second->started) return false;
    request = it->second;
    live_.erase(it);
    queue_.Remove(id);
    ++stats_.requests_cancelled;
  }
  std::move(request->done)(absl::CancelledError("read cancelled"));
  delete request;
  return true;
}

bool DiskReader::Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return queue_.Reprioritize(id, priority, deadline);
}

bool DiskReader::NextChunk(bool wait, Chunk* chunk) {
  absl::MutexLock lock(&mu_);
  if (wait) {
    auto ready = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
    mu_.Await(absl::Condition(&ready));
  }
  const std::optional<RequestId> next = queue_.Front();
  if (!next) return false;
  Request* request = live_.at(*next);
  const ReadTarget& target = request->targets[request->next_target];
  const uint64_t end = AlignUp(target.offset + target.length);
  chunk->request = request;
  chunk->target = &target;
  chunk->targets = 1;
  chunk->aligned_offset = request->next_offset;
  chunk->length = std::min(options_.chunk_bytes, end - request->next_offset);
  chunk->read = 0;
  chunk->in_place = nullptr;
  if (target.aligned_window) {
    uint8_t* window = target.destination - target.offset % kAlignment;
    chunk->in_place = window + (chunk->aligned_offset - AlignDown(target.offset));
  } else if (chunk->aligned_offset + chunk->length == end) {
    // The chunk ends the target: the next targets of the same file whose blocks touch or overlap
    // its own join it, as long as it stays within a chunk.
    for (size_t next = request->next_target + 1; next < request->targets.size(); ++next) {
      const ReadTarget& more = request->targets[next];
      const uint64_t chunk_end = chunk->aligned_offset + chunk->length;
      const uint64_t more_end = AlignUp(more.offset + more.length);
      if (more.length == 0 || more.aligned_window || more.path != target.path ||
          more.model_file != target.model_file ||
          AlignDown(more.offset) > chunk_end + kMaxMergedGap ||
          AlignDown(more.offset) < chunk->aligned_offset ||
          more_end - chunk->aligned_offset > options_.chunk_bytes) {
        break;
      }
      chunk->length = std::max(chunk_end, more_end) - chunk->aligned_offset;
      ++chunk->targets;
    }
    uint64_t wanted = 0;
    for (size_t i = 0; i < chunk->targets; ++i) {
      const auto [begin, end] = WantedPart(*chunk, chunk->target[i]);
      wanted += end - begin;
    }
    chunk->sparse = wanted * kSparseDenominator < chunk->length * kSparseNumerator;
  }
  request->started = true;
  ++request->outstanding;
  request->next_offset += chunk->length;
  if (chunk->targets > 1 || request->next_offset >= end) {
    request->next_target += chunk->targets;
    request->next_offset = 0;
    request->SettleCursor();
  }
  if (request->issued_all) queue_.Remove(request->id);
  return true;
}

void DiskReader::FinishChunk(const Chunk& chunk, const absl::Status& status) {
  Request* request = chunk.request;
  std::vector<std::unique_ptr<File>> retired;  // closed after the lock
  {
    absl::MutexLock lock(&mu_);
    --request->outstanding;
    if (status.ok()) {
      for (size_t i = 0; i < chunk.targets; ++i) {
        const auto [begin, end] = WantedPart(chunk, chunk.target[i]);
        stats_.bytes_delivered += end - begin;
      }
    } else if (request->status.ok()) {
      request->status = status;
      if (!request->issued_all) {
        // Nothing more of a failed request is read.
        request->issued_all = true;
        queue_.Remove(request->id);
      }
    }
    if (!request->issued_all || request->outstanding > 0) return;
    live_.erase(request->id);
    ++(request->status.ok() ? stats_.requests_completed : stats_.requests_failed);
    // With no request live no read is in flight: retired descriptors can be closed (below).
    if (live_.empty()) retired.swap(retired_files_);
  }
  std::move(request->done)(request->status);
  delete request;
}

void DiskReader::RetireFile(File* file) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(file->path);
  if (it == files_.end() || it->second.get() != file) return;  // retired already
  retired_files_.push_back(std::move(it->second));
  files_.erase(it);
}

absl::StatusOr<ScopedFd> DiskReader::OpenDescriptor(const ReadTarget& target, bool direct) const {
  OpenForReadOptions open;
  open.direct = direct;
  if (target.model_file != nullptr) open.beneath = &options_.model_roots;
  absl::StatusOr<ScopedFd> fd = file_system_->OpenForRead(target.path, open);
  if (fd.ok() && target.model_file != nullptr) {
    if (absl::Status same = CheckModelFile(fd->get(), *target.model_file); !same.ok()) return same;
  }
  return fd;
}

absl::StatusOr<DiskReader::File*> DiskReader::OpenFile(const ReadTarget& target) {
  const std::string& path = target.path;
  {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(path);
    if (it != files_.end()) {
      File* file = it->second.get();
      // The descriptor must still be the file `target` was registered as: a file modified in
      // place since it was opened is caught here, before another chunk of it is read. One that
      // fails is retired and the path opened again, since the registration may be newer than the
      // descriptor (a file replaced, then its model registered again).
      if (target.model_file == nullptr ||
          CheckModelFile(file->buffered_fd, *target.model_file).ok()) {
        return file;
      }
      retired_files_.push_back(std::move(it->second));
      files_.erase(it);
    }
  }
  auto file = std::make_unique<File>();
  file->path = path;
  absl::StatusOr<ScopedFd> buffered = OpenDescriptor(target, /*direct=*/false);
  if (!buffered.ok()) return buffered.status();
  file->buffered_fd = buffered->Release();
  file->memory_backed = IsMemoryBacked(file->buffered_fd);
  bool direct_refused = false;
  if (options_.direct && !file->memory_backed) {
    absl::StatusOr<ScopedFd> direct = OpenDescriptor(target, /*direct=*/true);
    // Both descriptors must be the recorded file: the path could change between the two opens.
    if (!direct.ok() && target.model_file != nullptr &&
        (absl::IsFailedPrecondition(direct.status()) ||
         absl::IsPermissionDenied(direct.status()))) {
      return direct.status();
    }
    direct_refused = !direct.ok();
    file->direct_fd = direct.ok() ? direct->Release() : -1;
    file->use_direct = !direct_refused;
  }
  absl::MutexLock lock(&mu_);
  const bool memory_backed = file->memory_backed;
  auto [it, inserted] = files_.emplace(path, std::move(file));
  if (inserted && memory_backed) ++stats_.memory_files;
  if (inserted && direct_refused) {
    ++stats_.buffered_files;
    TIERD_LOG_FIRST_N(WARNING, 1) << "O_DIRECT refused for " << path
                                  << " (tmpfs or overlayfs?): reading such files buffered";
  }
  return it->second.get();  // when another thread opened it first, ours is dropped here
}

void DiskReader::UseBuffered(File* file, int error) {
  if (!file->use_direct.exchange(false)) return;  // another chunk got there first
  absl::MutexLock lock(&mu_);
  ++stats_.buffered_files;
  TIERD_LOG_FIRST_N(WARNING, 1) << "O_DIRECT reads of " << file->path << " fail ("
                                << std::strerror(error) << "): reading such files buffered";
}

void DiskReader::NoteBytesRead(uint64_t bytes, bool sparse) {
  absl::MutexLock lock(&mu_);
  stats_.bytes_read += bytes;
  if (sparse) stats_.sparse_bytes_read += bytes;
}

void DiskReader::ForgetFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  files_.erase(path);
}

DiskReaderStats DiskReader::stats() const {
  absl::MutexLock lock(&mu_);
  DiskReaderStats stats = stats_;
  stats.queued_requests = queue_.size();
  return stats;
}

}  // namespace tierd
