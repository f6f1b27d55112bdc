#include "storage/model/catalog_file.h"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "storage/model/json_file.h"
#include "storage/model/object_checksum.h"
#include "storage/model/object_layout.h"
#include "storage/model/shard.h"
#include "storage/model_location.h"

namespace tierd {
namespace {

using Json = nlohmann::json;

// 2: object checksums in segments (object_checksum.h). A file of format 1 holds checksums of the
// whole object's bytes: it is read, the checksums of objects over one segment dropped (ParseModel).
// A daemon built before format 2 sets a format-2 file aside as corrupt: the change is one-way.
constexpr int kFormatVersion = 2;
constexpr int kWholeObjectChecksumsFormat = 1;

std::optional<uint64_t> ParseHex64(const std::string& text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    value = value << 4 | static_cast<uint64_t>(digit);
  }
  return value;
}

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("malformed catalog file: ", what));
}

absl::StatusOr<TensorPlacement> ParseTensor(const Json& json) {
  TensorPlacement tensor;
  std::string dtype;
  const Json* shape = JsonMember(&json, "shape");
  if (!JsonString(JsonMember(&json, "name"), &tensor.name) ||
      !JsonString(JsonMember(&json, "dtype"), &dtype) || !JsonIsArray(shape) ||
      !JsonUint(JsonMember(&json, "offset"), &tensor.offset) ||
      !JsonUint(JsonMember(&json, "size"), &tensor.size)) {
    return Corrupt("bad tensor");
  }
  const std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed.has_value()) return Corrupt(absl::StrCat("unknown dtype ", dtype));
  tensor.dtype = *parsed;
  for (const Json& dim : *shape) {
    if (!JsonUint(&dim, &tensor.shape.emplace_back())) return Corrupt("bad shape");
  }
  return tensor;
}

absl::StatusOr<ObjectInfo> ParseObject(const Json& json, const std::vector<ModelFile>& files) {
  ObjectInfo object;
  const Json* tensors = JsonMember(&json, "tensors");
  const Json* extents = JsonMember(&json, "extents");
  if (!JsonString(JsonMember(&json, "name"), &object.name) ||
      !JsonUint(JsonMember(&json, "size"), &object.size) || !JsonIsArray(tensors) ||
      !JsonIsArray(extents)) {
    return Corrupt("bad object");
  }
  for (const Json& tensor : *tensors) {
    ASSIGN_OR_RETURN(object.tensors.emplace_back(), ParseTensor(tensor));
  }
  for (const Json& json_extent : *extents) {
    uint64_t fields[4];
    if (!json_extent.is_array() || json_extent.size() != 4) return Corrupt("bad extent");
    for (size_t i = 0; i < 4; ++i) {
      if (!JsonUint(&json_extent[i], &fields[i])) return Corrupt("bad extent");
    }
    if (fields[0] > UINT32_MAX) return Corrupt("bad extent");
    object.extents.push_back(
        Extent{static_cast<uint32_t>(fields[0]), fields[1], fields[2], fields[3]});
  }
  RETURN_IF_ERROR(ValidateObject(object, files));
  return object;
}

}  // namespace

absl::StatusOr<std::string> SerializeModel(const ModelInfo& info,
                                           const std::map<std::string, uint64_t>& checksums) {
  Json files = Json::array();
  for (const ModelFile& file : info.files) {
    Json entry = {{"path", file.path},
                  {"size", file.size},
                  {"mtime_ns", file.mtime_ns},
                  {"device", file.device},
                  {"inode", file.inode}};
    if (!file.etag.empty()) entry["etag"] = file.etag;
    files.push_back(std::move(entry));
  }
  Json objects = Json::array();
  for (const ObjectInfo& object : info.objects) {
    Json tensors = Json::array();
    for (const TensorPlacement& tensor : object.tensors) {
      tensors.push_back({{"name", tensor.name},
                         {"dtype", DTypeName(tensor.dtype)},
                         {"shape", tensor.shape},
                         {"offset", tensor.offset},
                         {"size", tensor.size}});
    }
    Json extents = Json::array();
    for (const Extent& e : object.extents) {
      extents.push_back({e.file, e.file_offset, e.length, e.object_offset});
    }
    objects.push_back(
        {{"name", object.name}, {"size", object.size}, {"tensors", tensors}, {"extents", extents}});
  }
  Json sums = Json::object();
  for (const auto& [object, checksum] : checksums) {
    sums[object] = absl::StrFormat("%016x", checksum);
  }
  const Json doc = {{"format", kFormatVersion},
                    {"name", info.name},
                    {"directory", info.directory},
                    {"grouping", GroupingName(info.grouping)},
                    {"derived_tensors", info.derived_tensors},
                    {"keep_raw", info.keep_raw},
                    {"files", files},
                    {"objects", objects},
                    {"checksums", sums}};
  // Paths are bytes on Linux but JSON strings are UTF-8; refuse rather than persist a mangled
  // name that would not match on reload. Compact: a model of many tensors makes a large file.
  try {
    return doc.dump();
  } catch (const Json::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", info.name, "' has a path or tensor name that is not UTF-8"));
  }
}

// Parses and checks a persisted model; `expected_name` is the one its file name says.
absl::StatusOr<LoadedModel> ParseModel(absl::string_view text, const std::string& expected_name) {
  const std::optional<Json> doc = ParseBoundedJson(text);
  if (!doc.has_value()) return Corrupt("not JSON");
  LoadedModel loaded;
  ModelInfo& info = loaded.info;
  uint64_t format = 0;
  std::string grouping;
  const Json* files = JsonMember(&*doc, "files");
  const Json* objects = JsonMember(&*doc, "objects");
  const Json* checksums = JsonMember(&*doc, "checksums");
  if (!JsonUint(JsonMember(&*doc, "format"), &format) ||
      (format != kFormatVersion && format != kWholeObjectChecksumsFormat)) {
    return Corrupt("unknown format version");
  }
  if (!JsonString(JsonMember(&*doc, "name"), &info.name) ||
      !JsonString(JsonMember(&*doc, "directory"), &info.directory) ||
      !JsonString(JsonMember(&*doc, "grouping"), &grouping) || !JsonIsArray(files) ||
      !JsonIsArray(objects) || !JsonIsObject(checksums)) {
    return Corrupt("missing or mistyped field");
  }
  if (info.name != expected_name) {
    return Corrupt(absl::StrCat("names model '", info.name, "', not '", expected_name, "'"));
  }
  RETURN_IF_ERROR(ValidateModelName(info.name));
  absl::StatusOr<ModelLocation> directory = ParseModelLocation(info.directory);
  if (!directory.ok()) return Corrupt("bad directory");
  info.in_object_store = directory->in_object_store();
  const std::optional<Grouping> parsed_grouping = ParseGrouping(grouping);
  if (!parsed_grouping.has_value()) return Corrupt(absl::StrCat("unknown grouping ", grouping));
  info.grouping = *parsed_grouping;
  // Absent from files written before models could have derived tensors: none.
  if (const Json* keep_raw = JsonMember(&*doc, "keep_raw"); keep_raw != nullptr) {
    if (!keep_raw->is_boolean()) return Corrupt("bad keep_raw");
    info.keep_raw = keep_raw->get<bool>();
  }
  if (const Json* derived = JsonMember(&*doc, "derived_tensors");
      derived != nullptr && !JsonUint(derived, &info.derived_tensors)) {
    return Corrupt("bad derived_tensors");
  }
  for (const Json& json_file : *files) {
    ModelFile& file = info.files.emplace_back();
    if (!JsonString(JsonMember(&json_file, "path"), &file.path) ||
        !JsonUint(JsonMember(&json_file, "size"), &file.size) ||
        !JsonInt(JsonMember(&json_file, "mtime_ns"), &file.mtime_ns)) {
      return Corrupt("bad file");
    }
    // Every file where its model is: a local absolute path, or an object of the same store.
    absl::StatusOr<ModelLocation> location = ParseModelLocation(file.path);
    if (!location.ok() || location->in_object_store() != info.in_object_store ||
        (!location->in_object_store() && !absl::StartsWith(file.path, "/"))) {
      return Corrupt("bad file");
    }
    if (location->in_object_store()) file.object = location->object;
    // A remote file's: without it reads of the file would go unchecked.
    if (const Json* etag = JsonMember(&json_file, "etag");
        (etag != nullptr && !JsonString(etag, &file.etag)) || (file.object && file.etag.empty())) {
      return Corrupt("bad file");
    }
    // Absent from files written before they were recorded: 0, filled in by Open.
    const Json* device = JsonMember(&json_file, "device");
    const Json* inode = JsonMember(&json_file, "inode");
    if ((device != nullptr && !JsonUint(device, &file.device)) ||
        (inode != nullptr && !JsonUint(inode, &file.inode))) {
      return Corrupt("bad file");
    }
  }
  for (const Json& json_object : *objects) {
    ASSIGN_OR_RETURN(ObjectInfo object, ParseObject(json_object, info.files));
    // Lookup binary-searches by name.
    if (!info.objects.empty() && info.objects.back().name >= object.name) {
      return Corrupt("objects not sorted by name");
    }
    info.total_bytes += object.size;
    info.objects.push_back(std::move(object));
  }
  for (auto it = checksums->begin(); it != checksums->end(); ++it) {
    std::string hex;
    std::optional<uint64_t> value;
    if (JsonString(&it.value(), &hex)) value = ParseHex64(hex);
    if (!value.has_value()) return Corrupt(absl::StrCat("bad checksum for ", it.key()));
    if (format == kWholeObjectChecksumsFormat) {
      // Of the whole object's bytes: the same value for an object of one segment or less; for a
      // larger one (or a shard, whose size is not at hand) no longer the checksum, so dropped —
      // the next read records one.
      const ObjectInfo* object = FindObject(info, it.key());
      if (object == nullptr || object->size > kChecksumSegmentBytes) {
        ++loaded.checksums_dropped;
        continue;
      }
    }
    // RecordChecksum never records one for an object or shard the model lacks; drop rather than
    // keep a value no lookup can reach.
    if (FindObject(info, it.key()) != nullptr || IsShardName(info, it.key())) {
      loaded.checksums.emplace(it.key(), *value);
    }
  }
  return loaded;
}

}  // namespace tierd
