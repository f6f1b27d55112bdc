#include "storage/remote_reader.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tierd {

absl::StatusOr<std::unique_ptr<RemoteReader>> RemoteReader::Create(
    S3Client& client, const RemoteReaderOptions& options, RemoteCache* cache) {
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

RemoteReader::RemoteReader(S3Client& client, const RemoteReaderOptions& options, RemoteCache* cache)
    : client_(client), cache_(cache), options_(options) {}

RemoteReader::~RemoteReader() {
  std::vector<absl::AnyInvocable<void(absl::Status) &&>> failed;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, request] : requests_) {
      request.parts.clear();
      if (request.status.ok()) {
        request.status = absl::UnavailableError("the remote reader is shutting down");
      }
    }
    ready_.clear();
    for (auto it = requests_.begin(); it != requests_.end();) {
      if (it->second.in_flight == 0) {
        failed.push_back(std::move(it->second.done));
        it = requests_.erase(it);
      } else {
        ++it;
      }
    }
  }
  client_.Cancel();  // the GETs in flight end at once; their requests end with them
  for (auto& done : failed)
    std::move(done)(absl::UnavailableError("the remote reader is shutting down"));
  for (std::thread& thread : threads_) thread.join();
}

RemoteReader::RequestId RemoteReader::Submit(ReadRequest read) {
  Request request;
  request.priority = read.priority;
  request.deadline = read.deadline;
  request.done = std::move(read.done);
  absl::Status invalid;
  for (const ReadTarget& target : read.targets) {
    absl::StatusOr<S3Url> url = ParseS3Url(target.path);
    if (!url.ok()) {
      invalid = url.status();
      break;
    }
    const ModelFile* file = target.model_file;
    const bool cached = cache_ != nullptr && file != nullptr;
    for (uint64_t done = 0; done < target.length;) {
      const uint64_t offset = target.offset + done;
      // With the cache, up to the end of the chunk `offset` is in.
      const uint64_t most =
          cached ? cache_->chunk_bytes() - offset % cache_->chunk_bytes() : options_.part_bytes;
      const uint64_t length = std::min(most, target.length - done);
      request.parts.push_back(Part{*url, file != nullptr ? file->etag : "", cached ? file->size : 0,
                                   offset, length, target.destination + done});
      done += length;
    }
  }
  absl::MutexLock lock(&mu_);
  request.id = next_id_++;
  const RequestId id = request.id;
  if (!invalid.ok() || stopping_ || request.parts.empty()) {
    auto done = std::move(request.done);
    const absl::Status status = !invalid.ok() ? invalid
                                : stopping_
                                    ? absl::UnavailableError("the remote reader is shutting down")
                                    : absl::OkStatus();
    ++(status.ok() ? stats_.requests_completed : stats_.requests_failed);
    mu_.Unlock();
    std::move(done)(status);
    mu_.Lock();
    return id;
  }
  ready_.insert(OrderOf(request));
  requests_.emplace(id, std::move(request));
  return id;
}

bool RemoteReader::Cancel(RequestId id) {
  absl::AnyInvocable<void(absl::Status) &&> done;
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.started) return false;
    ready_.erase(OrderOf(it->second));
    done = std::move(it->second.done);
    requests_.erase(it);
    ++stats_.requests_cancelled;
  }
  std::move(done)(absl::CancelledError("the read was cancelled"));
  return true;
}

bool RemoteReader::Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.parts.empty()) return false;
  Request& request = it->second;
  ready_.erase(OrderOf(request));
  request.priority = priority;
  request.deadline = deadline;
  ready_.insert(OrderOf(request));
  return true;
}

RemoteReaderStats RemoteReader::stats() const {
  absl::MutexLock lock(&mu_);
  RemoteReaderStats stats = stats_;
  stats.queued_requests = ready_.size();
  return stats;
}

absl::AnyInvocable<void(absl::Status) &&> RemoteReader::FinishIfDoneLocked(Request& request,
                                                                           absl::Status* status) {
  if (request.in_flight > 0 || !request.parts.empty()) return nullptr;
  *status = request.status;
  ++(status->ok() ? stats_.requests_completed : stats_.requests_failed);
  auto done = std::move(request.done);
  requests_.erase(request.id);
  return done;
}

absl::Status RemoteReader::Fetch(const Part& part, uint64_t offset, uint64_t length,
                                 uint8_t* destination) {
  std::optional<FileSemaphore::Slot> host_slot;  // held while the GET runs
  if (host_streams_ != nullptr) {
    absl::StatusOr<FileSemaphore::Slot> slot = host_streams_->Acquire();
    if (slot.ok()) {
      host_slot.emplace(*std::move(slot));
    } else {
      TIERD_LOG_EVERY_N_SEC(WARNING, 10)
          << "remote reader: reading past the host's bound: " << slot.status();
    }
  }
  return client_.ReadRange(part.url, offset, length, destination, part.etag);
}

absl::StatusOr<uint64_t> RemoteReader::ReadPart(const Part& part) {
  if (cache_ == nullptr || part.file_size == 0) {
    RETURN_IF_ERROR(Fetch(part, part.offset, part.length, part.destination));
    return part.length;
  }
  const RemoteChunkKey file{part.url.ToString(), part.etag, part.file_size};
  return cache_->Read(file, part.offset, part.length, part.destination,
                      [&](uint64_t offset, uint64_t length, uint8_t* destination) {
                        return Fetch(part, offset, length, destination);
                      });
}

void RemoteReader::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](RemoteReader* r)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return r->stopping_ || !r->ready_.empty(); },
        this));
    if (ready_.empty()) return;  // stopping
    const RequestId id = std::get<2>(*ready_.begin());
    Request& request = requests_.at(id);
    Part part = std::move(request.parts.front());
    request.parts.pop_front();
    if (request.parts.empty()) ready_.erase(ready_.begin());
    request.started = true;
    ++request.in_flight;
    ++stats_.parts_in_flight;

    mu_.Unlock();
    const absl::StatusOr<uint64_t> fetched = ReadPart(part);
    const absl::Status status = fetched.status();
    mu_.Lock();

    --stats_.parts_in_flight;
    Request& same = requests_.at(id);
    --same.in_flight;
    if (status.ok()) {
      stats_.bytes_read += part.length;
      stats_.bytes_fetched += *fetched;
      if (*fetched == 0) stats_.bytes_from_cache += part.length;
    } else if (same.status.ok()) {
      same.status = status;
      if (!same.parts.empty()) {
        ready_.erase(OrderOf(same));
        same.parts.clear();  // the rest would be for nothing
      }
    }
    absl::Status outcome;
    if (auto done = FinishIfDoneLocked(same, &outcome)) {
      mu_.Unlock();
      std::move(done)(std::move(outcome));
      mu_.Lock();
    }
  }
}

}  // namespace tierd
