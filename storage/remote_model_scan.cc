#include "storage/remote_model_scan.h"

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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "storage/safetensors_header.h"

namespace tierd {
namespace {

// Bytes [0, length) of `url`, of the version `etag`.
absl::StatusOr<std::string> ReadStart(S3Client& client, const S3Url& url, uint64_t length,
                                      const std::string& etag) {
  std::string bytes(length, '\0');
  RETURN_IF_ERROR(client.ReadRange(url, 0, length, reinterpret_cast<uint8_t*>(bytes.data()), etag));
  return bytes;
}

// The first bytes a scan reads of each file: the 8-byte length and, mostly, the header after it.
constexpr uint64_t kFirstReadBytes = 256 << 10;
// Files whose first bytes are read at once.
constexpr size_t kParallelFileReads = 16;

struct FileStart {
  S3Url url;
  uint64_t size = 0;
  std::string etag;  // the listing's; when it had none, HEAD's
  absl::StatusOr<std::string> bytes = absl::UnknownError("not read");  // [0, kFirstReadBytes)
};

// Fills in each file's ETag (when the listing gave none) and first bytes, up to
// kParallelFileReads files at a time. The ETag holds for every later read of the file: an object
// replaced meanwhile is refused.
void ReadFileStarts(S3Client& client, std::vector<FileStart>& files) {
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < files.size(); i = next++) {
      FileStart& file = files[i];
      if (file.etag.empty()) {  // some gateways list multipart uploads without one; HEAD has it
        absl::StatusOr<S3ObjectHead> head = client.Head(file.url);
        if (!head.ok()) {
          file.bytes = head.status();
          continue;
        }
        if (head->size != file.size) {
          file.bytes = absl::FailedPreconditionError("its size changed");
          continue;
        }
        file.etag = head->etag;
      }
      file.bytes = ReadStart(client, file.url, std::min(kFirstReadBytes, file.size), file.etag);
    }
  };
  std::vector<std::thread> helpers;
  const size_t threads = std::min(kParallelFileReads, files.size());
  for (size_t i = 1; i < threads; ++i) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer at once: this thread reads the rest
    }
  }
  work();
  for (std::thread& helper : helpers) helper.join();
}

absl::Status Changed(const std::string& path) {
  return absl::UnavailableError(absl::StrCat(path, " changed while it was being registered"));
}

}  // namespace

absl::StatusOr<ScannedModel> ScanRemoteModel(
    S3Url prefix, S3Client& client,
    const std::function<void(const RegistrationProgress&)>& progress, size_t max_tensors) {
  if (!prefix.key.empty() && prefix.key.back() != '/') prefix.key.push_back('/');
  ScannedModel scanned;
  scanned.directory = prefix.ToString();
  if (absl::EndsWith(scanned.directory, "/")) scanned.directory.pop_back();

  ASSIGN_OR_RETURN(const std::vector<S3ListedObject> listed,
                   client.List(prefix.bucket, prefix.key));
  // The model's "directory": the objects right under the prefix, not those further down.
  std::map<std::string, S3ListedObject> here;
  for (const S3ListedObject& object : listed) {
    const std::string name = object.key.substr(prefix.key.size());
    if (!name.empty() && name.find('/') == std::string::npos) here.emplace(name, object);
  }
  const std::string index_url = absl::StrCat(scanned.directory, "/", kSafetensorsIndexFileName);
  std::optional<std::map<std::string, std::string>> weight_map;
  std::vector<std::string> file_names;
  if (auto index = here.find(kSafetensorsIndexFileName); index != here.end()) {
    if (index->second.size > kMaxSafetensorsIndexBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_url, ": an index of ", index->second.size, " bytes is too large"));
    }
    ASSIGN_OR_RETURN(const std::string text, ReadStart(client, {prefix.bucket, index->second.key},
                                                       index->second.size, index->second.etag));
    ASSIGN_OR_RETURN(weight_map, ParseSafetensorsIndex(text, index_url));
    std::set<std::string> distinct;
    for (const auto& [tensor, file] : *weight_map) distinct.insert(file);
    file_names.assign(distinct.begin(), distinct.end());
    for (const std::string& name : file_names) {
      if (here.count(name) == 0) {
        return absl::NotFoundError(absl::StrCat(index_url, " names ", Quote(name),
                                                ", which is not in ", scanned.directory));
      }
    }
  } else {
    for (const auto& [name, object] : here) {
      if (IsSafetensorsFileName(name)) file_names.push_back(name);
    }
    if (file_names.empty()) {
      return absl::NotFoundError(absl::StrCat("no .safetensors objects in ", scanned.directory));
    }
  }

  // Each file's ETag and first bytes, which hold the header of all but the largest: fetched for
  // several files at once, as each costs a round trip or two to the endpoint.
  std::vector<FileStart> starts(file_names.size());
  for (size_t i = 0; i < file_names.size(); ++i) {
    const S3ListedObject& object = here.at(file_names[i]);
    starts[i].url = {prefix.bucket, object.key};
    starts[i].size = object.size;
    starts[i].etag = object.etag;
  }
  ReadFileStarts(client, starts);

  std::map<std::string, uint32_t> tensor_file;
  for (uint32_t i = 0; i < file_names.size(); ++i) {
    FileStart& file_start = starts[i];
    const std::string path = file_start.url.ToString();
    if (absl::IsFailedPrecondition(file_start.bytes.status())) return Changed(path);
    if (!file_start.bytes.ok()) return file_start.bytes.status();
    absl::StatusOr<std::string>& start = file_start.bytes;
    uint64_t header_length = 0;
    if (start->size() >= 8) std::memcpy(&header_length, start->data(), 8);
    const uint64_t wanted = std::min<uint64_t>(
        file_start.size, 8 + std::min(header_length, kMaxSafetensorsHeaderBytes));
    if (wanted > start->size()) {  // a header larger than the first read
      start = ReadStart(client, file_start.url, wanted, file_start.etag);
      if (absl::IsFailedPrecondition(start.status())) return Changed(path);
      if (!start.ok()) return start.status();
    }
    absl::StatusOr<SafetensorsHeader> header =
        ParseSafetensorsHeader(path, *start, file_start.size, max_tensors - scanned.tensors.size());
    file_start.bytes = std::string();  // its memory back before the next file's parse
    if (IsTensorLimit(header.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model in ", Quote(scanned.directory), " has more than ", max_tensors,
                       " tensors, the limit (--max-tensors-per-model)"));
    }
    if (!header.ok()) return header.status();
    RETURN_IF_ERROR(AddFileTensors(*std::move(header), i, file_names, tensor_file, scanned));
    ModelFile file;
    file.path = path;
    file.size = file_start.size;
    file.etag = file_start.etag;
    scanned.files.push_back(std::move(file));
    if (progress) progress(RegistrationProgress{i + 1u, file_names.size(), path});
  }
  if (weight_map.has_value()) {
    RETURN_IF_ERROR(CheckIndexAgainstFiles(*weight_map, file_names, tensor_file, index_url));
  }
  return scanned;
}

}  // namespace tierd
