#include "client/tierctl_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/fd_io.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "device/pinned_host_buffer.h"

namespace tierd {
namespace {

// The temporary file a GetObjectToFile under way writes (RemoveUnfinishedOutput).
absl::Mutex unfinished_mu;
const std::string* unfinished_output ABSL_GUARDED_BY(unfinished_mu) = nullptr;

// Bounds the host memory `get` needs however large the object.
constexpr uint64_t kCopyChunkBytes = uint64_t{64} << 20;

constexpr char kStdio[] = "-";

// Where `get` writes. A regular file (or a path where nothing is yet) is written as a temporary
// file beside it and renamed over it on Commit, so it appears only whole; dropped without Commit,
// the temporary is removed. Anything else that exists already — a character device such as
// /dev/null, a FIFO, a terminal — is written in place: renaming a file over it would replace the
// device node itself (as root, /dev/null for the whole machine). "-" stands for stdout.
class OutputFile {
 public:
  static absl::StatusOr<std::unique_ptr<OutputFile>> Open(const std::string& path) {
    if (path == kStdio) return std::unique_ptr<OutputFile>(new OutputFile("stdout", "", "", -1));
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
      }
      if (!S_ISREG(st.st_mode)) {
        // Not truncated, not replaced: a device or a FIFO takes the bytes as they come.
        const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) return PosixError(absl::StrCat("opening ", path), errno);
        return std::unique_ptr<OutputFile>(new OutputFile(path, "", "", fd));
      }
    } else if (errno != ENOENT) {
      return PosixError(absl::StrCat("stat ", path), errno);
    }
    // Renamed over the file a link names, not over the link.
    std::string target = path;
    if (char* resolved = ::realpath(path.c_str(), nullptr); resolved != nullptr) {
      target = resolved;
      std::free(resolved);
    }
    // A name of its own (never a file of the user's that happens to be called PATH.tmp).
    std::string temp_path = absl::StrCat(target, ".tierctl-XXXXXX");
    const int fd = ::mkostemp(temp_path.data(), O_CLOEXEC);
    if (fd < 0) return PosixError(absl::StrCat("creating a temporary file beside ", path), errno);
    // mkostemp makes it 0600; the file gets the mode a plain create would give it.
    const mode_t umask = ::umask(0);
    ::umask(umask);
    ::fchmod(fd, 0666 & ~umask);
    auto file = std::unique_ptr<OutputFile>(
        new OutputFile(path, std::move(target), std::move(temp_path), fd));
    absl::MutexLock lock(&unfinished_mu);
    unfinished_output = &file->temp_path_;
    return file;
  }

  ~OutputFile() {
    {
      absl::MutexLock lock(&unfinished_mu);
      if (unfinished_output == &temp_path_) unfinished_output = nullptr;
    }
    if (!temp_path_.empty() && !committed_) ::unlink(temp_path_.c_str());
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  absl::Status Write(const void* data, size_t bytes) {
    return WriteAll(fd_.get() < 0 ? STDOUT_FILENO : fd_.get(),
                    absl::string_view(static_cast<const char*>(data), bytes),
                    temp_path_.empty() ? path_ : temp_path_);
  }

  absl::Status Commit() {
    if (fd_.get() < 0) return absl::OkStatus();  // stdout
    RETURN_IF_ERROR(fd_.Close(temp_path_.empty() ? path_ : temp_path_));
    if (temp_path_.empty()) return absl::OkStatus();  // written in place
    if (::rename(temp_path_.c_str(), target_.c_str()) != 0) {
      return PosixError(absl::StrCat("renaming ", temp_path_, " to ", target_), errno);
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  OutputFile(std::string path, std::string target, std::string temp_path, int fd)
      : path_(std::move(path)),
        target_(std::move(target)),
        temp_path_(std::move(temp_path)),
        fd_(fd) {}

  const std::string path_;       // as the user gave it
  const std::string target_;     // the regular file renamed over; empty when written in place
  const std::string temp_path_;  // empty when written in place
  ScopedFd fd_;                  // of temp_path_, or of path_ itself; -1 for stdout
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

void RemoveUnfinishedOutput() {
  absl::MutexLock lock(&unfinished_mu);
  if (unfinished_output != nullptr) ::unlink(unfinished_output->c_str());
}

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
  ASSIGN_OR_RETURN(std::unique_ptr<PinnedHostBuffer> buffer, ReadInput(device, fd, name, &size));

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
