#include "storage/model/remote_model_scan.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/byte_budget.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "storage/model/safetensors_header.h"

namespace tierd {
namespace {

// The first bytes a scan reads of each file: the 8-byte length and, mostly, the header after it.
constexpr uint64_t kFirstReadBytes = 256 << 10;

// Bytes [0, length) of `url`, of the version `etag` (an object `size` bytes long).
absl::StatusOr<std::string> ReadStart(ObjectStore& client, const S3Url& url, uint64_t length,
                                      const std::string& etag, uint64_t size,
                                      const std::atomic<bool>* cancelled) {
  std::string bytes(length, '\0');
  ObjectReadOptions read;
  read.etag = etag;
  read.object_size = size;
  read.cancelled = cancelled;
  RETURN_IF_ERROR(client.ReadRange(url, 0, length, reinterpret_cast<uint8_t*>(bytes.data()), read));
  return bytes;
}

absl::Status Changed(const std::string& path) {
  return absl::UnavailableError(absl::StrCat(path, " changed while it was being registered"));
}

absl::Status Cancelled() {
  return absl::CancelledError("the registration's caller went away; the registration stopped");
}

// A file not read because the scan stopped: another file failed, or the caller went away.
absl::Status NotRead() { return absl::AbortedError("not read: the scan stopped"); }

struct FileScan {
  S3Url url;
  uint64_t size = 0;
  std::string etag;  // the listing's; when it had none, HEAD's
  // Unset when the file was not read (an earlier failure stopped the scan).
  std::optional<absl::StatusOr<SafetensorsHeader>> header;
};

// Reads and parses the headers of `files`, up to options.parallel_reads at a time, each parsed
// as soon as its bytes are in. The first failure stops the files not yet started.
class HeaderReader {
 public:
  HeaderReader(ObjectStore& client, std::vector<FileScan>& files, const RemoteScanOptions& options,
               const std::function<void(const RegistrationProgress&)>& progress)
      : client_(client),
        files_(files),
        options_(options),
        progress_(progress),
        budget_(options.max_bytes_in_flight) {}

  void Run() {
    std::vector<std::thread> helpers;
    const size_t threads = std::min<size_t>(std::max(1, options_.parallel_reads), files_.size());
    for (size_t i = 1; i < threads; ++i) {
      try {
        helpers.emplace_back([this] { Work(); });
      } catch (const std::system_error&) {
        break;  // fewer at once: this thread reads the rest
      }
    }
    Work();
    for (std::thread& helper : helpers) helper.join();
  }

 private:
  bool Stopped() const {
    return failed_.load() || (options_.cancelled != nullptr && options_.cancelled->load());
  }

  void Work() {
    for (size_t i = next_++; i < files_.size() && !Stopped(); i = next_++) {
      FileScan& file = files_[i];
      file.header = Read(file);
      if (absl::IsAborted(file.header->status())) {
        file.header.reset();
        continue;
      }
      if (!file.header->ok()) {
        failed_ = true;
        continue;
      }
      absl::MutexLock lock(&progress_mu_);
      ++done_;
      if (progress_) progress_(RegistrationProgress{done_, files_.size(), file.url.ToString()});
    }
  }

  absl::StatusOr<SafetensorsHeader> Read(FileScan& file) {
    const std::string path = file.url.ToString();
    if (file.etag.empty()) {  // some gateways list multipart uploads without one; HEAD has it
      ASSIGN_OR_RETURN(const ObjectHead head, client_.Head(file.url));
      if (head.size != file.size) return Changed(path);
      file.etag = head.etag;
    }
    if (file.etag.empty()) {
      return absl::DataLossError(
          absl::StrCat("the store gives ", path, " no ETag: its versions could not be told apart"));
    }
    uint64_t held = std::min(kFirstReadBytes, file.size);
    if (!budget_.Acquire(held, [this] { return Stopped(); })) return NotRead();
    absl::StatusOr<SafetensorsHeader> header = ReadHeld(file, path, held);
    budget_.Release(held);
    return header;
  }

  // Reads and parses the header, `held` bytes of the budget held (more taken for a header larger
  // than the first read, and `held` updated).
  absl::StatusOr<SafetensorsHeader> ReadHeld(FileScan& file, const std::string& path,
                                             uint64_t& held) {
    absl::StatusOr<std::string> start =
        ReadStart(client_, file.url, held, file.etag, file.size, options_.cancelled);
    if (absl::IsFailedPrecondition(start.status())) return Changed(path);
    if (!start.ok()) return start.status();
    uint64_t header_length = 0;
    if (start->size() >= 8) std::memcpy(&header_length, start->data(), 8);
    const uint64_t wanted =
        std::min<uint64_t>(file.size, 8 + std::min(header_length, kMaxSafetensorsHeaderBytes));
    if (wanted > start->size()) {  // a header larger than the first read
      *start = std::string();
      budget_.Release(held);
      held = 0;
      if (!budget_.Acquire(wanted, [this] { return Stopped(); })) return NotRead();
      held = wanted;
      start = ReadStart(client_, file.url, wanted, file.etag, file.size, options_.cancelled);
      if (absl::IsFailedPrecondition(start.status())) return Changed(path);
      if (!start.ok()) return start.status();
    }
    // The limit less what the files parsed so far hold (a race lets the sum pass it a little:
    // the caller checks the total).
    const size_t seen = tensors_seen_.load();
    const size_t left = options_.max_tensors > seen ? options_.max_tensors - seen : 0;
    absl::StatusOr<SafetensorsHeader> header =
        ParseSafetensorsHeader(path, *start, file.size, left);
    if (header.ok()) tensors_seen_ += header->tensors.size();
    return header;
  }

  ObjectStore& client_;
  std::vector<FileScan>& files_;
  const RemoteScanOptions& options_;
  const std::function<void(const RegistrationProgress&)>& progress_;
  ByteBudget budget_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> failed_{false};
  std::atomic<size_t> tensors_seen_{0};
  absl::Mutex progress_mu_;  // one progress call at a time
  size_t done_ ABSL_GUARDED_BY(progress_mu_) = 0;
};

absl::Status TensorLimit(const std::string& directory, size_t max_tensors) {
  return absl::InvalidArgumentError(absl::StrCat("the model in ", Quote(directory),
                                                 " has more than ", max_tensors,
                                                 " tensors, the limit (--max-tensors-per-model)"));
}

// The objects right under `prefix`, by their names below it (the client checks they are under it).
absl::StatusOr<std::map<std::string, ListedObject>> ListModelDirectory(
    const S3Url& prefix, ObjectStore& client, const std::atomic<bool>* cancelled) {
  ASSIGN_OR_RETURN(const std::vector<ListedObject> listed,
                   client.List(prefix.bucket, prefix.key, ListLimits(), cancelled));
  std::map<std::string, ListedObject> here;
  for (const ListedObject& object : listed) {
    if (object.key.size() > prefix.key.size()) {
      here.emplace(object.key.substr(prefix.key.size()), object);
    }
  }
  return here;
}

// Which objects of the directory are the model's files: those its index names (the index's map is
// kept, to be checked against the headers), else every .safetensors object.
struct ChosenFiles {
  std::vector<std::string> names;
  std::optional<std::map<std::string, std::string>> weight_map;
};

absl::StatusOr<ChosenFiles> ChooseModelFiles(const S3Url& prefix, const std::string& directory,
                                             const std::map<std::string, ListedObject>& here,
                                             ObjectStore& client,
                                             const RemoteScanOptions& options) {
  ChosenFiles chosen;
  const std::string index_url = absl::StrCat(directory, "/", kSafetensorsIndexFileName);
  if (auto index = here.find(kSafetensorsIndexFileName); index != here.end()) {
    if (index->second.size > kMaxSafetensorsIndexBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_url, ": an index of ", index->second.size, " bytes is too large"));
    }
    if (index->second.etag.empty()) {
      return absl::DataLossError(absl::StrCat(
          "the store lists ", index_url, " without an ETag: its versions could not be told apart"));
    }
    ASSIGN_OR_RETURN(const std::string text,
                     ReadStart(client, {prefix.bucket, index->second.key}, index->second.size,
                               index->second.etag, index->second.size, options.cancelled));
    ASSIGN_OR_RETURN(chosen.weight_map, ParseSafetensorsIndex(text, index_url));
    std::set<std::string> distinct;
    for (const auto& [tensor, file] : *chosen.weight_map) distinct.insert(file);
    chosen.names.assign(distinct.begin(), distinct.end());
    for (const std::string& name : chosen.names) {
      if (here.count(name) == 0) {
        return absl::NotFoundError(
            absl::StrCat(index_url, " names ", Quote(name), ", which is not in ", directory));
      }
    }
  } else {
    for (const auto& [name, object] : here) {
      if (IsSafetensorsFileName(name)) chosen.names.push_back(name);
    }
    if (chosen.names.empty()) {
      return absl::NotFoundError(absl::StrCat("no .safetensors objects in ", directory));
    }
  }
  if (chosen.names.size() > options.max_files) {
    return absl::InvalidArgumentError(absl::StrCat("the model in ", directory, " has ",
                                                   chosen.names.size(), " files; at most ",
                                                   options.max_files, " are registered"));
  }
  return chosen;
}

// The files to scan, each a key a registered URL may be: it names the file in messages, in the
// catalog and in the remote cache.
absl::StatusOr<std::vector<FileScan>> FilesToScan(const S3Url& prefix, const std::string& directory,
                                                  const std::map<std::string, ListedObject>& here,
                                                  const std::vector<std::string>& names) {
  std::vector<FileScan> files(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const ListedObject& object = here.at(names[i]);
    const S3Url url{prefix.bucket, object.key};
    if (absl::Status s = ParseS3Url(url.ToString()).status(); !s.ok()) {
      return absl::DataLossError(absl::StrCat("the store lists ", Quote(object.key), " under ",
                                              directory,
                                              ", which is no key tierd reads: ", s.message()));
    }
    files[i].url = url;
    files[i].size = object.size;
    files[i].etag = object.etag;
  }
  return files;
}

// The first failure among the files' headers, in the files' order.
absl::Status FirstHeaderFailure(const std::vector<FileScan>& files, const std::string& directory,
                                const RemoteScanOptions& options) {
  if (options.cancelled != nullptr && *options.cancelled) return Cancelled();
  for (const FileScan& file : files) {
    if (file.header.has_value() && !file.header->ok()) {
      if (IsTensorLimit(file.header->status())) return TensorLimit(directory, options.max_tensors);
      return file.header->status();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ScannedModel> ScanRemoteModel(
    S3Url prefix, ObjectStore& client,
    const std::function<void(const RegistrationProgress&)>& progress,
    const RemoteScanOptions& options) {
  if (!prefix.key.empty() && prefix.key.back() != '/') prefix.key.push_back('/');
  ScannedModel scanned;
  scanned.directory = prefix.ToString();
  if (absl::EndsWith(scanned.directory, "/")) scanned.directory.pop_back();

  ASSIGN_OR_RETURN(const auto here, ListModelDirectory(prefix, client, options.cancelled));
  ASSIGN_OR_RETURN(const ChosenFiles chosen,
                   ChooseModelFiles(prefix, scanned.directory, here, client, options));
  ASSIGN_OR_RETURN(std::vector<FileScan> files,
                   FilesToScan(prefix, scanned.directory, here, chosen.names));
  // Each file's header, read and parsed for several files at once: each costs a round trip or
  // two to the endpoint.
  HeaderReader(client, files, options, progress).Run();
  RETURN_IF_ERROR(FirstHeaderFailure(files, scanned.directory, options));

  std::map<std::string, uint32_t> tensor_file;
  for (uint32_t i = 0; i < files.size(); ++i) {
    FileScan& file = files[i];
    RETURN_IF_ERROR(
        AddFileTensors(std::move(**file.header), i, chosen.names, tensor_file, scanned));
    file.header.reset();
    if (scanned.tensors.size() > options.max_tensors) {
      return TensorLimit(scanned.directory, options.max_tensors);
    }
    ModelFile model_file;
    model_file.path = file.url.ToString();
    model_file.size = file.size;
    model_file.etag = file.etag;
    model_file.object = file.url;
    scanned.files.push_back(std::move(model_file));
  }
  if (chosen.weight_map.has_value()) {
    RETURN_IF_ERROR(
        CheckIndexAgainstFiles(*chosen.weight_map, chosen.names, tensor_file,
                               absl::StrCat(scanned.directory, "/", kSafetensorsIndexFileName)));
  }
  return scanned;
}

}  // namespace tierd
