#include "storage/io/remote_reader.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tierd {
namespace {

// Ranges of one file at most this far apart are read by one GET: a request costs a round trip,
// and a strided shard's rows or a many-range derived tensor would cost one each.
constexpr uint64_t kMaxMergeGap = 256 << 10;

absl::Status ShuttingDown() { return absl::UnavailableError("the remote reader is shutting down"); }

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteReader>> RemoteReader::Create(
    ObjectStore& client, const RemoteReaderOptions& options, RemoteCache* cache) {
  if (options.streams < 1 || options.part_bytes == 0) {
    return absl::InvalidArgumentError("a remote reader needs at least one stream, and parts");
  }
  std::unique_ptr<RemoteReader> reader(new RemoteReader(client, options, cache));
  if (options.host_streams > 0) {
    ASSIGN_OR_RETURN(reader->host_streams_,
                     FileSemaphore::Open(options.host_streams_file, options.host_streams));
  }
  try {
    for (int i = 0; i < options.streams; ++i)
      reader->threads_.emplace_back([r = reader.get()] { r->Run(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("starting the remote reader's threads: ", e.what()));
  }
  return reader;
}

RemoteReader::RemoteReader(ObjectStore& client, const RemoteReaderOptions& options,
                           RemoteCache* cache)
    : client_(client), cache_(cache), options_(options) {}

RemoteReader::~RemoteReader() {
  Stop();
  for (std::thread& thread : threads_) thread.join();
}

void RemoteReader::Stop() {
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> failed;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    stopped_ = true;
    for (auto& [id, request] : requests_) {
      request.parts.clear();
      if (request.status.ok()) request.status = ShuttingDown();
    }
    ready_.TakeAll();
    for (auto it = requests_.begin(); it != requests_.end();) {
      if (it->second.in_flight == 0) {
        if (cache_ != nullptr) {
          for (const RemoteChunkUse& use : it->second.chunks) cache_->Discard(use, /*bad=*/false);
        }
        failed.push_back(std::move(it->second.done));
        ++stats_.requests_failed;
        it = requests_.erase(it);
      } else {
        ++it;
      }
    }
  }
  client_.Cancel();  // the GETs in flight end at once; their requests end with them
  for (auto& done : failed) std::move(done)(ShuttingDown());
}

absl::Status RemoteReader::Plan(const std::vector<ReadTarget>& targets, Request& request) const {
  // The pieces of each file, in file order.
  std::map<std::string, std::pair<File*, std::vector<Piece>>> by_path;
  for (const ReadTarget& target : targets) {
    auto [it, added] = by_path.try_emplace(target.path);
    if (added) {
      if (target.model_file == nullptr || !target.model_file->object) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a read of ", target.path, ", which is no registered file of an object store"));
      }
      auto file = std::make_unique<File>();
      file->url = *target.model_file->object;
      file->etag = target.model_file->etag;
      file->size = target.model_file->size;
      it->second.first = file.get();
      request.files.push_back(std::move(file));
    }
    if (target.length > 0) {
      it->second.second.push_back(Piece{target.offset, target.length, target.destination});
    }
  }
  for (auto& [path, file_pieces] : by_path) {
    File* file = file_pieces.first;
    std::vector<Piece>& pieces = file_pieces.second;
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    if (cache_ != nullptr && file->size > 0) {
      // One part per chunk, holding the request's every range in it.
      const uint64_t chunk = cache_->chunk_bytes();
      for (const Piece& piece : pieces) {
        for (uint64_t done = 0; done < piece.length;) {
          const uint64_t offset = piece.offset + done;
          const uint64_t index = offset / chunk;
          const uint64_t length = std::min(chunk - offset % chunk, piece.length - done);
          if (request.parts.empty() || request.parts.back().file != file ||
              request.parts.back().offset != index * chunk) {
            request.parts.push_back(Part{file, index * chunk, 0, {}});
          }
          Part& part = request.parts.back();
          part.pieces.push_back(Piece{offset, length, piece.destination + done});
          part.length = std::max(part.length, offset + length - part.offset);
          done += length;
        }
      }
      continue;
    }
    // Ranges close together in one GET of at most part_bytes; a longer range in several.
    for (const Piece& piece : pieces) {
      for (uint64_t done = 0; done < piece.length;) {
        const uint64_t offset = piece.offset + done;
        Part* last = request.parts.empty() || request.parts.back().file != file
                         ? nullptr
                         : &request.parts.back();
        uint64_t length;
        if (last != nullptr && offset >= last->offset &&
            offset <= last->offset + last->length + kMaxMergeGap &&
            offset - last->offset < options_.part_bytes) {
          // Into the last part, as far as part_bytes from its start.
          length = std::min(piece.length - done, last->offset + options_.part_bytes - offset);
          last->length = std::max(last->length, offset + length - last->offset);
        } else {
          length = std::min(options_.part_bytes, piece.length - done);
          request.parts.push_back(Part{file, offset, length, {}});
          last = &request.parts.back();
        }
        last->pieces.push_back(Piece{offset, length, piece.destination + done});
        done += length;
      }
    }
  }
  return absl::OkStatus();
}

RemoteReader::RequestId RemoteReader::Submit(ReadRequest read) {
  Request request;
  request.done = std::move(read.done);
  request.check = std::move(read.check);
  const absl::Status planned = Plan(read.targets, request);
  absl::MutexLock lock(&mu_);
  request.id = next_id_++;
  const RequestId id = request.id;
  if (!planned.ok() || stopping_ || request.parts.empty()) {
    absl::Status status = !planned.ok() ? planned : stopping_ ? ShuttingDown() : absl::OkStatus();
    if (status.ok() && request.check) {
      mu_.Unlock();
      status = request.check();
      mu_.Lock();
    }
    ++(status.ok() ? stats_.requests_completed : stats_.requests_failed);
    auto done = std::move(request.done);
    mu_.Unlock();
    std::move(done)(status);
    mu_.Lock();
    return id;
  }
  ready_.Push(id, read.priority, read.deadline);
  requests_.emplace(id, std::move(request));
  return id;
}

bool RemoteReader::Cancel(RequestId id) {
  absl::AnyInvocable<void(absl::Status) &&> done;
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.started) return false;
    ready_.Remove(id);
    done = std::move(it->second.done);
    requests_.erase(it);
    ++stats_.requests_cancelled;
  }
  std::move(done)(absl::CancelledError("the read was cancelled"));
  return true;
}

bool RemoteReader::Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return ready_.Reprioritize(id, priority, deadline);
}

RemoteReaderStats RemoteReader::stats() const {
  absl::MutexLock lock(&mu_);
  RemoteReaderStats stats = stats_;
  stats.queued_requests = ready_.size();
  return stats;
}

absl::AnyInvocable<void(absl::Status) &&> RemoteReader::FinishIfDoneLocked(RequestId id,
                                                                           absl::Status* status) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.in_flight > 0 || !it->second.parts.empty()) {
    return nullptr;
  }
  Request request = std::move(it->second);
  requests_.erase(it);
  mu_.Unlock();
  // The bytes are all in: the caller's check says whether what the cache served and fetched for
  // them may stay.
  if (request.status.ok() && request.check) request.status = request.check();
  if (cache_ != nullptr) {
    for (const RemoteChunkUse& use : request.chunks) {
      if (request.status.ok()) {
        cache_->Keep(use);
      } else {
        cache_->Discard(use, /*bad=*/absl::IsDataLoss(request.status));
      }
    }
  }
  mu_.Lock();
  *status = request.status;
  ++(status->ok() ? stats_.requests_completed : stats_.requests_failed);
  return std::move(request.done);
}

absl::Status RemoteReader::Fetch(const File& file, uint64_t offset, uint64_t length,
                                 uint8_t* destination) {
  const absl::Time deadline = absl::Now() + client_.call_timeout();
  std::optional<FileSemaphore::Slot> host_slot;  // held while the GET runs
  if (host_streams_ != nullptr) {
    absl::StatusOr<FileSemaphore::Slot> slot =
        host_streams_->Acquire(deadline, [this] { return stopped_.load(); });
    if (slot.ok()) {
      host_slot.emplace(*std::move(slot));
    } else if (absl::IsCancelled(slot.status())) {
      return slot.status();
    } else {
      TIERD_LOG_EVERY_N_SEC(WARNING, 10)
          << "remote reader: reading past the host's bound: " << slot.status();
    }
  }
  ObjectReadOptions read;
  read.etag = file.etag;
  read.object_size = file.size;
  read.deadline = deadline;
  return client_.ReadRange(file.url, offset, length, destination, read);
}

absl::StatusOr<uint64_t> RemoteReader::ReadPart(const Part& part, RemoteChunkUse* use) {
  const File& file = *part.file;
  if (cache_ == nullptr || file.size == 0) {
    if (part.pieces.size() == 1 && part.pieces[0].length == part.length) {
      RETURN_IF_ERROR(Fetch(file, part.offset, part.length, part.pieces[0].destination));
      return part.length;
    }
    // Several ranges in one GET: through a buffer of this thread's, kept for its next part.
    thread_local std::vector<uint8_t> buffer;
    if (buffer.size() < part.length) buffer.resize(part.length);
    RETURN_IF_ERROR(Fetch(file, part.offset, part.length, buffer.data()));
    for (const Piece& piece : part.pieces) {
      std::memcpy(piece.destination, buffer.data() + (piece.offset - part.offset), piece.length);
    }
    return part.length;
  }
  const RemoteChunkKey key{client_.id(), file.url.ToString(), file.etag, file.size};
  std::vector<RemoteCachePiece> pieces;
  pieces.reserve(part.pieces.size());
  for (const Piece& piece : part.pieces) {
    pieces.push_back(RemoteCachePiece{piece.offset, piece.length, piece.destination});
  }
  return cache_->Read(
      key, part.offset / cache_->chunk_bytes(), pieces,
      [&](uint64_t offset, uint64_t length, uint8_t* destination) {
        return Fetch(file, offset, length, destination);
      },
      use, absl::Now() + client_.call_timeout(), [this] { return stopped_.load(); });
}

void RemoteReader::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](RemoteReader* r)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return r->stopping_ || !r->ready_.empty(); },
        this));
    if (ready_.empty()) return;  // stopping
    const RequestId id = *ready_.Front();
    Request& request = requests_.at(id);
    Part part = std::move(request.parts.front());
    request.parts.pop_front();
    if (request.parts.empty()) ready_.Remove(id);
    request.started = true;
    ++request.in_flight;
    ++stats_.parts;
    ++stats_.parts_in_flight;

    mu_.Unlock();
    RemoteChunkUse use;
    const absl::StatusOr<uint64_t> fetched = ReadPart(part, &use);
    const absl::Status status = fetched.status();
    mu_.Lock();

    --stats_.parts_in_flight;
    Request& same = requests_.at(id);
    --same.in_flight;
    if (cache_ != nullptr && part.file->size > 0 && (use.pending || status.ok())) {
      same.chunks.push_back(use);
    }
    uint64_t delivered = 0;
    for (const Piece& piece : part.pieces) delivered += piece.length;
    if (status.ok()) {
      stats_.bytes_read += delivered;
      stats_.bytes_fetched += *fetched;
      if (*fetched == 0) stats_.bytes_from_cache += delivered;
    } else if (same.status.ok()) {
      same.status = status;
      if (!same.parts.empty()) {
        ready_.Remove(id);
        same.parts.clear();  // the rest would be for nothing
      }
    }
    absl::Status outcome;
    if (auto done = FinishIfDoneLocked(id, &outcome)) {
      mu_.Unlock();
      std::move(done)(std::move(outcome));
      mu_.Lock();
    }
  }
}

}  // namespace tierd
