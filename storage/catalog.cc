#include "storage/catalog.h"

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/directory.h"
#include "common/fd_io.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "storage/json_file.h"
#include "storage/model_scan.h"
#include "storage/object_checksum.h"
#include "storage/object_layout.h"

namespace tierd {

using Json = nlohmann::json;

struct Catalog::ModelEntry {
  // Set before the entry is published in models_, immutable afterwards.
  std::shared_ptr<const ModelInfo> info;

  // Guarded by Catalog::mu_ (an annotation here cannot name the enclosing catalog's mutex).
  std::string stale;  // non-empty: a file changed since registration, and why reads must not go on
  std::map<std::string, uint64_t> checksums;  // object name → checksum
  bool dirty = false;                         // checksums not yet persisted
};

namespace {

constexpr int kFormatVersion = 1;
// Far above any real model's file; only bounds what a damaged one can cost.
constexpr uint64_t kMaxCatalogFileBytes = 1ull << 30;

absl::Status SyncDirectory(const std::string& dir) {
  ScopedFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return PosixError(absl::StrCat("opening ", dir), errno);
  if (fsync(fd.get()) != 0) return PosixError(absl::StrCat("fsync ", dir), errno);
  return fd.Close(dir);
}

// Replaces dir/name with `contents` so that after a crash the file is either the old or the new
// version, never a mix: a temporary in the same directory, synced, renamed over, directory synced.
absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 absl::string_view contents) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string temp = absl::StrCat(path, ".tmp");
  ScopedFd fd(open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return PosixError(absl::StrCat("creating ", temp), errno);
  absl::Status status = WriteAll(fd.get(), contents, temp);
  if (status.ok() && fsync(fd.get()) != 0) status = PosixError(absl::StrCat("fsync ", temp), errno);
  absl::Status closed = fd.Close(temp);
  if (status.ok()) status = closed;
  if (status.ok() && rename(temp.c_str(), path.c_str()) != 0) {
    status = PosixError(absl::StrCat("renaming ", temp, " to ", path), errno);
  }
  if (!status.ok()) {
    unlink(temp.c_str());
    return status;
  }
  return SyncDirectory(dir);
}

absl::Status MakeDirectories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) return PosixError(absl::StrCat("creating ", path), error.value());
  return absl::OkStatus();
}

// --- Persistence: one JSON file per model. ---

absl::StatusOr<std::string> SerializeModel(const ModelInfo& info,
                                           const std::map<std::string, uint64_t>& checksums) {
  Json files = Json::array();
  for (const ModelFile& file : info.files) {
    files.push_back({{"path", file.path},
                     {"size", file.size},
                     {"mtime_ns", file.mtime_ns},
                     {"device", file.device},
                     {"inode", file.inode}});
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

const ObjectInfo* FindObject(const ModelInfo& info, absl::string_view name) {
  auto it = std::lower_bound(
      info.objects.begin(), info.objects.end(), name,
      [](const ObjectInfo& object, absl::string_view key) { return object.name < key; });
  return it != info.objects.end() && it->name == name ? &*it : nullptr;
}

struct LoadedModel {
  ModelInfo info;
  std::map<std::string, uint64_t> checksums;
};

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
  if (!JsonUint(JsonMember(&*doc, "format"), &format) || format != kFormatVersion) {
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
  const std::optional<Grouping> parsed_grouping = ParseGrouping(grouping);
  if (!parsed_grouping.has_value()) return Corrupt(absl::StrCat("unknown grouping ", grouping));
  info.grouping = *parsed_grouping;
  for (const Json& json_file : *files) {
    ModelFile& file = info.files.emplace_back();
    if (!JsonString(JsonMember(&json_file, "path"), &file.path) ||
        !JsonUint(JsonMember(&json_file, "size"), &file.size) ||
        !JsonInt(JsonMember(&json_file, "mtime_ns"), &file.mtime_ns) ||
        !absl::StartsWith(file.path, "/")) {
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
    // RecordChecksum never records one for an object the model lacks; drop rather than keep a
    // value no lookup can reach.
    if (FindObject(info, it.key()) != nullptr) loaded.checksums.emplace(it.key(), *value);
  }
  return loaded;
}

ModelSummary Summarize(const ModelInfo& info) {
  ModelSummary summary;
  summary.name = info.name;
  summary.directory = info.directory;
  summary.grouping = info.grouping;
  summary.files = info.files.size();
  summary.objects = info.objects.size();
  summary.total_bytes = info.total_bytes;
  for (const ObjectInfo& object : info.objects) summary.tensors += object.tensors.size();
  return summary;
}

std::string ModelFileName(const std::string& model) { return absl::StrCat(model, ".json"); }

}  // namespace

std::optional<Grouping> ParseGrouping(absl::string_view name) {
  if (name == "tensor") return Grouping::kTensor;
  if (name == "block") return Grouping::kBlock;
  if (name == "phase") return Grouping::kPhase;
  return std::nullopt;
}

const char* GroupingName(Grouping grouping) {
  switch (grouping) {
    case Grouping::kTensor:
      return "tensor";
    case Grouping::kBlock:
      return "block";
    case Grouping::kPhase:
      return "phase";
  }
  return "block";  // unreachable: the switch covers every enumerator
}

GroupingRules GroupingRules::Defaults() {
  GroupingRules rules;
  // Lazy prefix so "a.blocks.1.x" gives "a.blocks.1"; \d+ then \. so "blocks.1" never swallows
  // "blocks.10".
  rules.block_patterns = {R"(^(.*?(?:blocks|layers|h)\.\d+)\.)"};
  // cross_attn before attn: "attn2" and "encoder_attn" are cross-attention in common layouts.
  rules.phase_patterns = {
      {"cross_attn", R"(^(cross_attn|cross_attention|encoder_attn|attn2)\.)"},
      {"attn", R"(^(self_attn|attn|attention|attn1|self_attention)\.)"},
      {"ffn", R"(^(ffn|mlp|feed_forward|ff)\.)"},
      {"norm", R"(^([a-z_]*norm[a-z_0-9]*|ln_?\d*)\.)"},
  };
  return rules;
}

absl::Status ValidateModelName(absl::string_view name) {
  bool valid = !name.empty() && name.size() <= 128 && name.front() != '.';
  for (char c : name) {
    valid = valid && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-');
  }
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("model name ", Quote(name),
                   " must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'"));
}

absl::StatusOr<std::pair<std::string, std::string>> SplitObjectKey(absl::string_view key) {
  const size_t slash = key.find('/');
  if (slash == absl::string_view::npos || slash == 0 || slash + 1 == key.size()) {
    return absl::InvalidArgumentError(absl::StrCat("key ", Quote(key), " is not MODEL/OBJECT"));
  }
  const absl::string_view model = key.substr(0, slash);
  const absl::Status valid = ValidateModelName(model);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("key ", Quote(key), ": ", valid.message()));
  }
  return std::make_pair(std::string(model), std::string(key.substr(slash + 1)));
}

Catalog::Catalog(std::string directory, ModelRoots roots, size_t max_tensors_per_model)
    : directory_(std::move(directory)),
      roots_(std::move(roots)),
      max_tensors_per_model_(max_tensors_per_model) {}

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(const std::string& state_dir,
                                                       ModelRoots roots,
                                                       size_t max_tensors_per_model) {
  if (state_dir.empty()) return absl::InvalidArgumentError("state directory is empty");
  const std::string dir = absl::StrCat(state_dir, "/catalog");
  RETURN_IF_ERROR(MakeDirectories(dir));
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ListDirectory(dir));
  std::unique_ptr<Catalog> catalog(new Catalog(dir, std::move(roots), max_tensors_per_model));
  for (const std::string& file_name : names) {
    const std::string path = absl::StrCat(dir, "/", file_name);
    if (absl::EndsWith(file_name, ".json.tmp")) {
      unlink(path.c_str());  // a write cut short by a crash; the .json it was replacing is intact
      continue;
    }
    if (!absl::EndsWith(file_name, ".json")) continue;
    const std::string model = file_name.substr(0, file_name.size() - 5);
    auto text = ReadFileBounded(path, kMaxCatalogFileBytes);
    if (!text.ok()) {
      // Not evidence of corruption (permissions, I/O): leave the file for a later start.
      TIERD_LOG(ERROR) << "catalog: skipping model '" << model << "': " << text.status();
      continue;
    }
    auto loaded = ParseModel(*text, model);
    if (!loaded.ok()) {
      // One bad file must not keep the daemon, or the other models, from coming up.
      const std::string aside = absl::StrCat(path, ".corrupt");
      TIERD_LOG(ERROR) << "catalog: " << path << ": " << loaded.status() << "; moved to " << aside;
      if (rename(path.c_str(), aside.c_str()) != 0) {
        TIERD_LOG(ERROR) << "catalog: " << PosixError(absl::StrCat("renaming ", path), errno);
      }
      continue;
    }
    auto entry = std::make_shared<ModelEntry>();
    // A catalog written before devices and inodes were recorded gets them now, for files that
    // still have their recorded size and mtime (the check such a catalog relied on), and is
    // written again with them.
    for (ModelFile& file : loaded->info.files) {
      if (RecordMissingIdentity(catalog->roots_, file)) entry->dirty = true;
    }
    // Offsets recorded for a file that changed would read the wrong bytes without any error; the
    // model stays listed so the operator sees it, but its objects cannot be read.
    const std::string changed = DescribeChangedFile(loaded->info.files, catalog->roots_);
    if (!changed.empty()) {
      entry->stale = absl::StrCat("model '", model, "' is stale: ", changed,
                                  "; drop and re-register the model");
      TIERD_LOG(WARNING) << "catalog: " << entry->stale;
    }
    entry->info = std::make_shared<const ModelInfo>(std::move(loaded->info));
    entry->checksums = std::move(loaded->checksums);
    absl::MutexLock lock(&catalog->mu_);
    catalog->models_.emplace(model, std::move(entry));
  }
  Catalog* raw = catalog.get();
  catalog->flusher_ = std::make_unique<std::thread>([raw] { raw->FlushLoop(); });
  return catalog;
}

Catalog::~Catalog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (flusher_ != nullptr) flusher_->join();
  const absl::Status status = Flush();
  if (!status.ok()) TIERD_LOG(ERROR) << "catalog: checksums not persisted: " << status;
}

absl::StatusOr<ModelSummary> Catalog::RegisterModel(
    const std::string& name, const std::string& directory, Grouping grouping,
    const GroupingRules& rules, const std::function<void(const RegistrationProgress&)>& progress,
    bool verify) {
  RETURN_IF_ERROR(ValidateModelName(name));
  // What a registration builds and drops (the headers' tensors, the serialized file) can be
  // hundreds of megabytes for a model of many tensors: given back to the system once done.
  struct TrimOnReturn {
    ~TrimOnReturn() { malloc_trim(0); }
  } trim;
  ASSIGN_OR_RETURN(const ObjectGrouper grouper, ObjectGrouper::Create(grouping, rules));
  const auto taken = [this, &name] {
    absl::MutexLock lock(&mu_);
    return models_.count(name) != 0;
  };
  const auto name_taken = [&name] {
    return absl::AlreadyExistsError(absl::StrCat("model '", name, "' is already registered"));
  };
  // Checked before the slow part so a duplicate fails fast, and again before committing.
  if (taken()) return name_taken();
  // The path as given: ".." and relative paths are refused before they are normalized away.
  if (roots_.confined()) RETURN_IF_ERROR(roots_.Check(directory));
  ASSIGN_OR_RETURN(ScannedModel scanned,
                   ScanModelDirectory(directory, progress, roots_, max_tensors_per_model_));

  auto info = std::make_shared<ModelInfo>();
  info->name = name;
  info->directory = std::move(scanned.directory);
  info->grouping = grouping;
  info->files = std::move(scanned.files);
  info->objects = BuildObjects(grouper, std::move(scanned.tensors));
  for (const ObjectInfo& object : info->objects) info->total_bytes += object.size;
  std::map<std::string, uint64_t> checksums;
  if (verify) {
    const size_t files = info->files.size();
    ASSIGN_OR_RETURN(
        checksums, ChecksumModelObjects(
                       *info, roots_,
                       [&progress, files](uint64_t done, uint64_t total, const std::string& file) {
                         if (progress)
                           progress(RegistrationProgress{files, files, file, done, total});
                       }));
  }
  ASSIGN_OR_RETURN(const std::string text, SerializeModel(*info, checksums));

  absl::MutexLock persist(&persist_mu_);
  if (taken()) return name_taken();
  RETURN_IF_ERROR(WriteFileAtomically(directory_, ModelFileName(name), text));
  auto entry = std::make_shared<ModelEntry>();
  entry->info = info;
  entry->checksums = std::move(checksums);
  absl::MutexLock lock(&mu_);
  models_.emplace(name, std::move(entry));
  return Summarize(*info);
}

absl::Status Catalog::DropModel(const std::string& name) {
  absl::MutexLock persist(&persist_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (models_.count(name) == 0) {
      return absl::NotFoundError(absl::StrCat("model ", Quote(name), " is not registered"));
    }
  }
  // File first: if it cannot be removed the model stays registered, matching what a restart sees.
  const std::string path = absl::StrCat(directory_, "/", ModelFileName(name));
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return PosixError(absl::StrCat("removing ", path), errno);
  }
  RETURN_IF_ERROR(SyncDirectory(directory_));
  {
    absl::MutexLock lock(&mu_);
    models_.erase(name);
  }
  // A model of many tensors frees much at once (when the tiers hold none of it any more).
  malloc_trim(0);
  return absl::OkStatus();
}

size_t Catalog::model_count() const {
  absl::MutexLock lock(&mu_);
  return models_.size();
}

std::vector<ModelSummary> Catalog::ListModels() const {
  absl::MutexLock lock(&mu_);
  std::vector<ModelSummary> summaries;
  summaries.reserve(models_.size());
  for (const auto& [name, entry] : models_) {
    summaries.push_back(Summarize(*entry->info));
    summaries.back().stale = entry->stale;
  }
  return summaries;
}

absl::StatusOr<std::shared_ptr<const ModelInfo>> Catalog::GetModel(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat("model ", Quote(name), " is not registered"));
  }
  return it->second->info;
}

absl::StatusOr<ObjectRef> Catalog::Lookup(absl::string_view key) const {
  ASSIGN_OR_RETURN(const auto split, SplitObjectKey(key));
  std::shared_ptr<const ModelInfo> info;
  {
    absl::MutexLock lock(&mu_);
    auto it = models_.find(split.first);
    if (it == models_.end()) {
      return absl::NotFoundError(absl::StrCat("model ", Quote(split.first), " is not registered"));
    }
    if (!it->second->stale.empty()) return absl::FailedPreconditionError(it->second->stale);
    info = it->second->info;
  }
  const ObjectInfo* object = FindObject(*info, split.second);
  if (object == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model ", Quote(split.first), " has no object ", Quote(split.second)));
  }
  return ObjectRef{std::move(info), object, std::string(key)};
}

bool Catalog::IsCurrent(const std::shared_ptr<const ModelInfo>& model) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(model->name);
  return it != models_.end() && it->second->info == model && it->second->stale.empty();
}

void Catalog::MarkStale(const std::shared_ptr<const ModelInfo>& model, const std::string& why) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(model->name);
  if (it == models_.end() || it->second->info != model || !it->second->stale.empty()) return;
  it->second->stale =
      absl::StrCat("model '", model->name, "' is stale: ", why, "; drop and re-register the model");
  TIERD_LOG(WARNING) << "catalog: " << it->second->stale;
}

std::optional<uint64_t> Catalog::Checksum(const std::string& key) const {
  auto split = SplitObjectKey(key);
  if (!split.ok()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto model = models_.find(split->first);
  if (model == models_.end()) return std::nullopt;
  auto it = model->second->checksums.find(split->second);
  if (it == model->second->checksums.end()) return std::nullopt;
  return it->second;
}

void Catalog::RecordChecksum(const std::string& key, uint64_t checksum) {
  auto split = SplitObjectKey(key);
  if (!split.ok()) return;
  absl::MutexLock lock(&mu_);
  auto model = models_.find(split->first);
  // An unknown object is ignored too: its checksum could never be looked up, and a persisted one
  // would make the file fail validation on the next start.
  if (model == models_.end() || FindObject(*model->second->info, split->second) == nullptr) return;
  ModelEntry& entry = *model->second;
  auto [it, inserted] = entry.checksums.emplace(split->second, checksum);
  if (!inserted && it->second == checksum) return;
  it->second = checksum;
  entry.dirty = true;
}

absl::Status Catalog::Flush() {
  absl::MutexLock persist(&persist_mu_);
  struct Pending {
    std::shared_ptr<ModelEntry> entry;
    std::map<std::string, uint64_t> checksums;
  };
  std::vector<Pending> pending;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, entry] : models_) {
      if (!entry->dirty) continue;
      pending.push_back(Pending{entry, entry->checksums});
      entry->dirty = false;
    }
  }
  // persist_mu_ keeps DropModel out until these writes are done, so none of them can bring back
  // the file of a model dropped in the meantime.
  absl::Status first_error;
  for (const Pending& p : pending) {
    absl::StatusOr<std::string> text = SerializeModel(*p.entry->info, p.checksums);
    absl::Status status = text.status();
    if (status.ok()) {
      status = WriteFileAtomically(directory_, ModelFileName(p.entry->info->name), *text);
    }
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      p.entry->dirty = true;  // retried by the next flush
      if (first_error.ok()) first_error = status;
    }
  }
  return first_error;
}

void Catalog::FlushLoop() {
  bool failing = false;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Sleeps, rather than polls, between flushes; the destructor's stopping_ wakes it at once.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(1));
      if (stopping_) return;  // the destructor flushes what is left
    }
    const absl::Status status = Flush();
    // Once per run of failures: the retry every second must not flood the log.
    if (!status.ok() && !failing) TIERD_LOG(ERROR) << "catalog: flush failed: " << status;
    if (status.ok() && failing) TIERD_LOG(INFO) << "catalog: flush succeeded again";
    failing = !status.ok();
  }
}

}  // namespace tierd
