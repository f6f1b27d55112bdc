#include "storage/model/catalog.h"

#include <malloc.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "storage/model/catalog_file.h"
#include "storage/model/derived_tensors.h"
#include "storage/model/json_file.h"
#include "storage/model/model_scan.h"
#include "storage/model/object_checksum.h"
#include "storage/model/object_layout.h"
#include "storage/model/remote_model_scan.h"
#include "storage/model/shard.h"
#include "storage/model_location.h"

namespace tierd {

struct Catalog::ModelEntry {
  // Set before the entry is published in models_, immutable afterwards.
  std::shared_ptr<const ModelInfo> info;

  // Guarded by Catalog::mu_ (an annotation here cannot name the enclosing catalog's mutex).
  std::string stale;  // non-empty: a file changed since registration, and why reads must not go on
  std::map<std::string, uint64_t> checksums;  // object or shard name → checksum
  size_t shard_checksums = 0;                 // of them, shards'
  bool dirty = false;                         // checksums not yet persisted
  // Shards derived so far (FindShard), so that a shard's layout is computed once, not at every
  // lookup; the oldest go first past kMaxCachedShardExtents extents in all.
  std::map<std::string, std::shared_ptr<const ObjectInfo>> shards;
  std::deque<std::string> shard_order;
  size_t shard_extents = 0;
};

namespace {

// Far above any real model's file; only bounds what a damaged one can cost.
constexpr uint64_t kMaxCatalogFileBytes = 1ull << 30;

// Extents of the shards a model keeps derived (a shard of one extent per row of a wide tensor has
// up to 262,144): about 32 MiB at most.
constexpr size_t kMaxCachedShardExtents = 1 << 20;

// Shards whose checksums a model keeps (the first read of a shard records one, later reads are
// checked against it). Clients choose which shards exist; past this, a shard's reads go unchecked
// against its first, as an object's before its first read.
constexpr size_t kMaxShardChecksumsPerModel = 65536;

size_t CountShardChecksums(const ModelInfo& info, const std::map<std::string, uint64_t>& sums) {
  size_t shards = 0;
  for (const auto& [name, sum] : sums) shards += FindObject(info, name) == nullptr ? 1 : 0;
  return shards;
}

ModelSummary Summarize(const ModelInfo& info) {
  ModelSummary summary;
  summary.name = info.name;
  summary.directory = info.directory;
  summary.grouping = info.grouping;
  summary.files = info.files.size();
  summary.objects = info.objects.size();
  summary.total_bytes = info.total_bytes;
  summary.derived_tensors = info.derived_tensors;
  summary.keep_raw = info.keep_raw;
  for (const ObjectInfo& object : info.objects) summary.tensors += object.tensors.size();
  return summary;
}

std::string ModelFileName(const std::string& model) { return absl::StrCat(model, ".json"); }

}  // namespace

Catalog::Catalog(std::string directory, ModelRoots roots, size_t max_tensors_per_model,
                 std::shared_ptr<FileSystem> file_system)
    : directory_(std::move(directory)),
      file_system_(std::move(file_system)),
      roots_(std::move(roots)),
      max_tensors_per_model_(max_tensors_per_model) {}

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(const std::string& state_dir,
                                                       ModelRoots roots,
                                                       size_t max_tensors_per_model,
                                                       std::shared_ptr<FileSystem> file_system,
                                                       ObjectStore* remote) {
  if (state_dir.empty()) return absl::InvalidArgumentError("state directory is empty");
  const std::string dir = absl::StrCat(state_dir, "/catalog");
  file_system = FileSystemOrDefault(std::move(file_system));
  RETURN_IF_ERROR(file_system->CreateDirectories(dir));
  ASSIGN_OR_RETURN(const std::vector<std::string> names, file_system->ListDirectory(dir));
  std::unique_ptr<Catalog> catalog(
      new Catalog(dir, std::move(roots), max_tensors_per_model, file_system));
  catalog->remote_ = remote;
  for (const std::string& file_name : names) {
    const std::string path = absl::StrCat(dir, "/", file_name);
    if (absl::EndsWith(file_name, ".json.tmp")) {
      // A write cut short by a crash; the .json it was replacing is intact.
      (void)file_system->RemoveFile(path);
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
      if (absl::Status renamed = file_system->Rename(path, aside); !renamed.ok()) {
        TIERD_LOG(ERROR) << "catalog: " << renamed;
      }
      continue;
    }
    auto entry = std::make_shared<ModelEntry>();
    if (loaded->checksums_dropped > 0) {
      TIERD_LOG(WARNING) << "catalog: model '" << model << "' was recorded with checksums of whole "
                         << "objects; " << loaded->checksums_dropped
                         << " of them (objects over 4 MiB, shards) are recorded again, in "
                            "segments, as those objects are read";
      entry->dirty = true;
    }
    // A catalog written before devices and inodes were recorded gets them now, for files that
    // still have their recorded size and mtime (the check such a catalog relied on), and is
    // written again with them.
    for (ModelFile& file : loaded->info.files) {
      if (!file.object && RecordMissingIdentity(catalog->roots_, file)) entry->dirty = true;
    }
    // Offsets recorded for a file that changed would read the wrong bytes without any error; the
    // model stays listed so the operator sees it, but its objects cannot be read. (A remote
    // file's ETag is checked by every read of it instead.)
    const std::string changed = loaded->info.in_object_store
                                    ? ""
                                    : DescribeChangedFile(loaded->info.files, catalog->roots_);
    if (!changed.empty()) {
      entry->stale = absl::StrCat("model '", model, "' is stale: ", changed,
                                  "; drop and re-register the model");
      TIERD_LOG(WARNING) << "catalog: " << entry->stale;
    }
    entry->info = std::make_shared<const ModelInfo>(std::move(loaded->info));
    entry->checksums = std::move(loaded->checksums);
    entry->shard_checksums = CountShardChecksums(*entry->info, entry->checksums);
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
    bool verify, const std::vector<DerivedTensorSpec>& derived, bool keep_raw,
    const std::atomic<bool>* cancelled) {
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
  ScannedModel scanned;
  ASSIGN_OR_RETURN(const ModelLocation location, ParseModelLocation(directory));
  if (location.in_object_store()) {
    const S3Url& url = location.object;
    RETURN_IF_ERROR(roots_.CheckRemote(url));
    if (remote_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot register ", directory, ": this daemon has no remote source (--s3-endpoint)"));
    }
    if (verify) {
      return absl::InvalidArgumentError(
          "verify reads local files; a remote model's objects are checksummed on their first read");
    }
    RemoteScanOptions scan;
    scan.max_tensors = max_tensors_per_model_;
    scan.cancelled = cancelled;
    ASSIGN_OR_RETURN(scanned, ScanRemoteModel(url, *remote_, progress, scan));
  } else {
    if (roots_.confined()) RETURN_IF_ERROR(roots_.Check(directory));
    ASSIGN_OR_RETURN(scanned,
                     ScanModelDirectory(directory, progress, roots_, max_tensors_per_model_));
  }

  RETURN_IF_ERROR(ApplyDerivedTensors(derived, scanned.tensors));
  if (scanned.tensors.size() > max_tensors_per_model_) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", Quote(name), " would have ", scanned.tensors.size(),
                     " tensors with its derived ones; at most ", max_tensors_per_model_,
                     " are allowed (tierd --max-tensors-per-model)"));
  }

  auto info = std::make_shared<ModelInfo>();
  info->name = name;
  info->derived_tensors = derived.size();
  info->keep_raw = keep_raw;
  info->directory = std::move(scanned.directory);
  info->in_object_store = location.in_object_store();
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
  // A caller that went away (its deadline passed, it was killed) gets no registration it can
  // no longer learn of.
  if (cancelled != nullptr && *cancelled) {
    return absl::CancelledError(absl::StrCat("registering ", Quote(name),
                                             ": the caller went away; nothing was registered"));
  }
  RETURN_IF_ERROR(WriteModelFile(name, text));
  auto entry = std::make_shared<ModelEntry>();
  entry->info = info;
  entry->checksums = std::move(checksums);
  absl::MutexLock lock(&mu_);
  models_.emplace(name, std::move(entry));
  return Summarize(*info);
}

absl::Status Catalog::WriteModelFile(const std::string& name, absl::string_view text) {
  const std::string path = absl::StrCat(directory_, "/", ModelFileName(name));
  const absl::string_view parts[] = {text};
  return WriteFileAtomically(*file_system_, path, absl::StrCat(path, ".tmp"), parts, 0644);
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
  if (absl::Status removed = file_system_->RemoveFile(path);
      !removed.ok() && !absl::IsNotFound(removed)) {
    return removed;
  }
  RETURN_IF_ERROR(file_system_->SyncDirectory(directory_));
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

bool Catalog::InModelNamespace(absl::string_view key) const {
  const size_t slash = key.find('/');
  if (slash == absl::string_view::npos) return false;
  const std::string name(key.substr(0, slash));
  absl::MutexLock lock(&mu_);
  return models_.count(name) > 0;
}

absl::StatusOr<ObjectRef> Catalog::Lookup(absl::string_view key) const {
  ASSIGN_OR_RETURN(const auto split, SplitObjectKey(key));
  std::shared_ptr<const ModelInfo> info;
  std::shared_ptr<ModelEntry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = models_.find(split.first);
    if (it == models_.end()) {
      return absl::NotFoundError(absl::StrCat("model ", Quote(split.first), " is not registered"));
    }
    if (!it->second->stale.empty()) return absl::FailedPreconditionError(it->second->stale);
    entry = it->second;
    info = entry->info;
    if (auto cached = entry->shards.find(split.second); cached != entry->shards.end()) {
      std::shared_ptr<const ObjectInfo> shard = cached->second;
      const ObjectInfo* object = shard.get();
      return ObjectRef{std::move(info), object, std::string(key), std::move(shard)};
    }
  }
  if (const ObjectInfo* object = FindObject(*info, split.second); object != nullptr) {
    return ObjectRef{std::move(info), object, std::string(key), nullptr};
  }
  // Derived without the lock, and kept for the next lookup.
  ASSIGN_OR_RETURN(ObjectInfo shard_info, FindShard(*info, split.second));
  shards_derived_.fetch_add(1, std::memory_order_relaxed);
  auto shard = std::make_shared<const ObjectInfo>(std::move(shard_info));
  {
    absl::MutexLock lock(&mu_);
    if (entry->shards.emplace(split.second, shard).second) {
      entry->shard_order.push_back(split.second);
      entry->shard_extents += shard->extents.size();
      while (entry->shard_extents > kMaxCachedShardExtents && entry->shard_order.size() > 1) {
        auto oldest = entry->shards.find(entry->shard_order.front());
        entry->shard_extents -= oldest->second->extents.size();
        entry->shards.erase(oldest);
        entry->shard_order.pop_front();
      }
    }
  }
  const ObjectInfo* object = shard.get();
  return ObjectRef{std::move(info), object, std::string(key), std::move(shard)};
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
  if (model == models_.end()) return;
  ModelEntry& entry = *model->second;
  if (FindObject(*entry.info, split->second) == nullptr) {
    // A shard's, up to a bound: clients choose which shards exist.
    if (!IsShardName(*entry.info, split->second)) return;
    const bool known = entry.checksums.count(split->second) > 0;
    if (!known && entry.shard_checksums >= kMaxShardChecksumsPerModel) return;
    if (!known) ++entry.shard_checksums;
  }
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
      status = WriteModelFile(p.entry->info->name, *text);
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
