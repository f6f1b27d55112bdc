#include "client/tierctl_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fd_io.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "device/pinned_host_buffer.h"

namespace tierd {
namespace {

// Bounds the host memory `get` needs however large the object.
constexpr uint64_t kCopyChunkBytes = uint64_t{64} << 20;

constexpr char kStdio[] = "-";

// A file written as PATH.tmp and renamed to PATH on Commit; dropped without Commit, the temporary
// file is removed. "-" stands for stdout, written directly.
class OutputFile {
 public:
  static absl::StatusOr<std::unique_ptr<OutputFile>> Open(const std::string& path) {
    if (path == kStdio) return std::unique_ptr<OutputFile>(new OutputFile(path, "", -1));
    std::string temp_path = absl::StrCat(path, ".tmp");
    const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return PosixError(absl::StrCat("creating ", temp_path), errno);
    return std::unique_ptr<OutputFile>(new OutputFile(path, std::move(temp_path), fd));
  }

  ~OutputFile() {
    if (!temp_path_.empty() && !committed_) ::unlink(temp_path_.c_str());
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  absl::Status Write(const void* data, size_t bytes) {
    return WriteAll(temp_path_.empty() ? STDOUT_FILENO : fd_.get(),
                    absl::string_view(static_cast<const char*>(data), bytes),
                    temp_path_.empty() ? "stdout" : temp_path_);
  }

  absl::Status Commit() {
    if (temp_path_.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(fd_.Close(temp_path_));
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
      return PosixError(absl::StrCat("renaming ", temp_path_, " to ", path_), errno);
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  OutputFile(std::string path, std::string temp_path, int fd)
      : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

  const std::string path_;
  const std::string temp_path_;  // empty for stdout
  ScopedFd fd_;                  // of temp_path_
  bool committed_ = false;
};

// The whole input in page-locked memory of `device`, which StoreAsync copies from. A regular file
// is read straight into it; a pipe, whose size is known only at its end, through a string.
absl::StatusOr<std::unique_ptr<PinnedHostBuffer>> ReadInput(Device& device, int fd,
                                                            const std::string& name,
                                                            uint64_t* size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return PosixError(absl::StrCat("stat ", name), errno);
  // PinnedHostBuffer refuses 0 bytes; an empty object still needs a valid source address.
  if (S_ISREG(st.st_mode)) {
    *size = static_cast<uint64_t>(st.st_size);
    ASSIGN_OR_RETURN(std::unique_ptr<PinnedHostBuffer> buffer,
                     PinnedHostBuffer::Create(device, std::max<uint64_t>(*size, 1)));
    ASSIGN_OR_RETURN(const size_t got, ReadUpTo(fd, buffer->data(), *size, name));
    if (got != *size) {
      return absl::FailedPreconditionError(
          absl::StrCat(name, " shrank from ", *size, " to ", got, " bytes while being read"));
    }
    return buffer;
  }
  std::string contents;
  constexpr size_t kPipeChunk = size_t{1} << 20;
  while (true) {
    const size_t old_size = contents.size();
    contents.resize(old_size + kPipeChunk);
    ASSIGN_OR_RETURN(const size_t got, ReadUpTo(fd, contents.data() + old_size, kPipeChunk, name));
    contents.resize(old_size + got);
    if (got < kPipeChunk) break;
  }
  *size = contents.size();
  ASSIGN_OR_RETURN(std::unique_ptr<PinnedHostBuffer> buffer,
                   PinnedHostBuffer::Create(device, std::max<size_t>(contents.size(), 1)));
  std::memcpy(buffer->data(), contents.data(), contents.size());
  return buffer;
}

}  // namespace

absl::StatusOr<uint64_t> GetObjectToFile(Client& client, const std::string& key,
                                         const std::string& path) {
  // Before any daemon work, so an unwritable path fails fast.
  ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> out, OutputFile::Open(path));
  ASSIGN_OR_RETURN(std::unique_ptr<Session> session, client.OpenSession());
  Device& device = session->device();
  Stream& stream = session->default_stream();
  ASSIGN_OR_RETURN(Lease lease, session->Fetch(key, stream));
  const uint64_t size = lease.size();
  ASSIGN_OR_RETURN(
      std::unique_ptr<PinnedHostBuffer> buffer,
      PinnedHostBuffer::Create(device, std::max<uint64_t>(std::min(size, kCopyChunkBytes), 1)));
  const char* source = static_cast<const char*>(lease.data());
  for (uint64_t offset = 0; offset < size;) {
    const size_t chunk = std::min<uint64_t>(buffer->size(), size - offset);
    // The copy is enqueued after Fetch's wait on the ready event, on the same stream.
    RETURN_IF_ERROR(device.CopyAsync(stream, buffer->data(), source + offset, chunk));
    RETURN_IF_ERROR(device.SynchronizeStream(stream));
    RETURN_IF_ERROR(out->Write(buffer->data(), chunk));
    offset += chunk;
  }
  lease.Release(stream);
  RETURN_IF_ERROR(out->Commit());
  return size;
}

absl::StatusOr<uint64_t> PutFileAsObject(Client& client, const std::string& key,
                                         const std::string& path, const PutOptions& policy) {
  // Opened before the session, so a missing file fails fast.
  const bool from_stdin = path == kStdio;
  const std::string name = from_stdin ? "stdin" : path;
  ScopedFd file(from_stdin ? -1 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!from_stdin && file.get() < 0) return PosixError(absl::StrCat("opening ", name), errno);
  const int fd = from_stdin ? STDIN_FILENO : file.get();
  ASSIGN_OR_RETURN(std::unique_ptr<Session> session, client.OpenSession());
  Device& device = session->device();
  Stream& stream = session->default_stream();
  uint64_t size = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<PinnedHostBuffer> buffer,
                   ReadInput(device, fd, name, &size));

  StoreRequest request;
  request.key = key;
  request.data = buffer->data();
  request.size = size;
  request.spillable = policy.spillable;
  request.durable = policy.durable;
  const absl::Status stored = session->StoreAsync(request, stream);
  // Even when the store failed, a copy out of the buffer may be in flight: the buffer may be freed
  // only once the stream has drained.
  const absl::Status synchronized = device.SynchronizeStream(stream);
  RETURN_IF_ERROR(stored);
  RETURN_IF_ERROR(synchronized);
  // The commit's own outcome (the host tier may refuse it).
  RETURN_IF_ERROR(session->Flush());
  return size;
}

}  // namespace tierd
