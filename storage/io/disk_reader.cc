#include "storage/io/disk_reader.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "storage/io/detail/disk_reader_parts.h"
#include "storage/io/detail/disk_reader_worker.h"
#include "storage/io/detail/memory_read.h"
#include "storage/model/model_scan.h"

namespace tierd {

using disk_reader_internal::AlignDown;
using disk_reader_internal::AlignUp;
using disk_reader_internal::kAlignment;
using disk_reader_internal::kSparseDenominator;
using disk_reader_internal::kSparseNumerator;
using disk_reader_internal::WantedPart;

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
