#include "storage/remote_model_scan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "storage/safetensors_header.h"

namespace tierd {
namespace {

constexpr char kSafetensorsSuffix[] = ".safetensors";

// Bytes [0, length) of `url`, of the version `etag`.
absl::StatusOr<std::string> ReadStart(S3Client& client, const S3Url& url, uint64_t length,
                                      const std::string& etag) {
  std::string bytes(length, '\0');
  RETURN_IF_ERROR(client.ReadRange(url, 0, length, reinterpret_cast<uint8_t*>(bytes.data()), etag));
  return bytes;
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
      if (name.size() > sizeof(kSafetensorsSuffix) - 1 &&
          absl::EndsWith(name, kSafetensorsSuffix)) {
        file_names.push_back(name);
      }
    }
    if (file_names.empty()) {
      return absl::NotFoundError(absl::StrCat("no .safetensors objects in ", scanned.directory));
    }
  }

  std::map<std::string, uint32_t> tensor_file;
  for (uint32_t i = 0; i < file_names.size(); ++i) {
    const S3ListedObject& object = here.at(file_names[i]);
    const S3Url url{prefix.bucket, object.key};
    const std::string path = url.ToString();
    // The ETag the listing gave holds for both reads: an object replaced meanwhile is refused.
    std::string etag = object.etag;
    if (etag.empty()) {  // some gateways list multipart uploads without one; HEAD has it
      ASSIGN_OR_RETURN(const S3ObjectHead head, client.Head(url));
      if (head.size != object.size) return Changed(path);
      etag = head.etag;
    }
    absl::StatusOr<std::string> start =
        ReadStart(client, url, std::min<uint64_t>(8, object.size), etag);
    if (absl::IsFailedPrecondition(start.status())) return Changed(path);
    if (!start.ok()) return start.status();
    uint64_t header_length = 0;
    if (start->size() == 8) std::memcpy(&header_length, start->data(), 8);
    const uint64_t wanted =
        std::min<uint64_t>(object.size, 8 + std::min(header_length, kMaxSafetensorsHeaderBytes));
    if (wanted > start->size()) {
      start = ReadStart(client, url, wanted, etag);
      if (absl::IsFailedPrecondition(start.status())) return Changed(path);
      if (!start.ok()) return start.status();
    }
    absl::StatusOr<SafetensorsHeader> header =
        ParseSafetensorsHeader(path, *start, object.size, max_tensors - scanned.tensors.size());
    if (IsTensorLimit(header.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model in ", Quote(scanned.directory), " has more than ", max_tensors,
                       " tensors, the limit (--max-tensors-per-model)"));
    }
    if (!header.ok()) return header.status();
    RETURN_IF_ERROR(AddFileTensors(*std::move(header), i, file_names, tensor_file, scanned));
    ModelFile file;
    file.path = path;
    file.size = object.size;
    file.etag = etag;
    scanned.files.push_back(std::move(file));
    if (progress) progress(RegistrationProgress{i + 1u, file_names.size(), path});
  }
  if (weight_map.has_value()) {
    RETURN_IF_ERROR(CheckIndexAgainstFiles(*weight_map, file_names, tensor_file, index_url));
  }
  return scanned;
}

}  // namespace tierd
