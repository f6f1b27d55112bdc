#include "storage/host/durable_store.h"

#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/fd_io.h"
#include "common/log.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "storage/dtype.h"
#include "storage/model/json_file.h"
#include "storage/model/object_checksum.h"

namespace tierd {
namespace {

constexpr char kMagic[8] = {'T', 'I', 'E', 'R', 'D', 'D', 'O', '1'};
constexpr uint64_t kFixedHeaderBytes = 24;  // magic, metadata length, reserved, checksum
constexpr uint64_t kPage = 4096;
// Metadata bigger than this is not a file of ours (65536 tensors with long names fit).
constexpr uint64_t kMaxMetadataBytes = 64ull << 20;
constexpr char kSuffix[] = ".tdo";
constexpr char kTemporarySuffix[] = ".tmp";
constexpr char kDamagedSuffix[] = ".damaged";

uint64_t RoundUpToPage(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

void PutLittleEndian(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t GetLittleEndian(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

// The file name of `key`'s version `generation`, without the suffix: the key's 128-bit hash (keys
// may hold any byte and be 1 KiB long) and the generation.
std::string BaseName(const std::string& key, uint64_t generation) {
  const XXH128_hash_t hash = XXH3_128bits(key.data(), key.size());
  return absl::StrFormat("%016x%016x-%d", hash.high64, hash.low64, generation);
}

nlohmann::json Metadata(const DurableRecord& record) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorPlacement& tensor : record.tensors) {
    tensors.push_back({{"name", tensor.name},
                       {"dtype", DTypeName(tensor.dtype)},
                       {"shape", tensor.shape},
                       {"offset", tensor.offset},
                       {"size", tensor.size}});
  }
  return {{"key", record.key},
          {"size", record.size},
          {"checksum", absl::StrFormat("%016x", record.checksum)},
          // Absent from records written before checksums were made of segments.
          {"checksum_segment_bytes", kChecksumSegmentBytes},
          {"generation", record.generation},
          {"tensors", std::move(tensors)}};
}

absl::StatusOr<DurableRecord> ParseMetadata(const nlohmann::json& json) {
  DurableRecord record;
  std::string checksum;
  if (!JsonString(JsonMember(&json, "key"), &record.key) || record.key.empty() ||
      !JsonUint(JsonMember(&json, "size"), &record.size) || record.size == 0 ||
      !JsonString(JsonMember(&json, "checksum"), &checksum) ||
      !absl::SimpleHexAtoi(checksum, &record.checksum) ||
      !JsonUint(JsonMember(&json, "generation"), &record.generation) ||
      !JsonIsArray(JsonMember(&json, "tensors"))) {
    return absl::DataLossError("metadata lacks key, size, checksum, generation or tensors");
  }
  if (const nlohmann::json* segments = JsonMember(&json, "checksum_segment_bytes")) {
    uint64_t segment_bytes = 0;
    if (!JsonUint(segments, &segment_bytes) || segment_bytes != kChecksumSegmentBytes) {
      return absl::DataLossError("checksum of segments of another size");
    }
  } else {
    record.whole_object_checksum = true;
  }
  for (const nlohmann::json& item : *JsonMember(&json, "tensors")) {
    TensorPlacement tensor;
    std::string dtype;
    const nlohmann::json* shape = JsonMember(&item, "shape");
    if (!JsonString(JsonMember(&item, "name"), &tensor.name) ||
        !JsonString(JsonMember(&item, "dtype"), &dtype) || !JsonIsArray(shape) ||
        !JsonUint(JsonMember(&item, "offset"), &tensor.offset) ||
        !JsonUint(JsonMember(&item, "size"), &tensor.size)) {
      return absl::DataLossError("a tensor lacks name, dtype, shape, offset or size");
    }
    std::optional<DType> parsed = ParseDType(dtype);
    if (!parsed) return absl::DataLossError(absl::StrCat("unknown dtype ", dtype));
    tensor.dtype = *parsed;
    for (const nlohmann::json& dimension : *shape) {
      uint64_t value;
      if (!JsonUint(&dimension, &value)) return absl::DataLossError("a shape is not numbers");
      tensor.shape.push_back(value);
    }
    if (tensor.offset > record.size || tensor.size > record.size - tensor.offset) {
      return absl::DataLossError(absl::StrCat("tensor ", tensor.name, " lies outside the object"));
    }
    record.tensors.push_back(std::move(tensor));
  }
  return record;
}

// Reads and checks the header of the version at `path`.
absl::StatusOr<DurableRecord> ReadHeader(FileSystem& file_system, const std::string& path) {
  ASSIGN_OR_RETURN(const ScopedFd fd, file_system.OpenForRead(path, OpenForReadOptions()));
  uint8_t fixed[kFixedHeaderBytes];
  ASSIGN_OR_RETURN(size_t got, ReadUpTo(fd.get(), fixed, sizeof(fixed), path));
  if (got < sizeof(fixed) || std::memcmp(fixed, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("not a durable object file (bad magic)");
  }
  const uint64_t metadata_bytes = GetLittleEndian(fixed + 8, 4);
  const uint64_t metadata_checksum = GetLittleEndian(fixed + 16, 8);
  if (metadata_bytes == 0 || metadata_bytes > kMaxMetadataBytes) {
    return absl::DataLossError(absl::StrCat("metadata length ", metadata_bytes, " is implausible"));
  }
  std::string metadata(metadata_bytes, '\0');
  ASSIGN_OR_RETURN(got, ReadUpTo(fd.get(), metadata.data(), metadata.size(), path));
  if (got < metadata.size()) return absl::DataLossError("the metadata is truncated");
  if (XXH3_64bits(metadata.data(), metadata.size()) != metadata_checksum) {
    return absl::DataLossError("the metadata's checksum does not match");
  }
  std::optional<nlohmann::json> json = ParseBoundedJson(metadata);
  if (!json) return absl::DataLossError("the metadata is not JSON");
  ASSIGN_OR_RETURN(DurableRecord record, ParseMetadata(*json));
  record.path = path;
  record.payload_offset = RoundUpToPage(kFixedHeaderBytes + metadata_bytes);
  struct stat info;
  if (::fstat(fd.get(), &info) != 0) return PosixError(absl::StrCat("stat ", path), errno);
  if (static_cast<uint64_t>(info.st_size) < record.payload_offset + record.size) {
    return absl::DataLossError(absl::StrCat("the file is ", info.st_size, " bytes, too short for ",
                                            record.size, " bytes of object"));
  }
  return record;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DurableStore>> DurableStore::Open(
    const std::string& directory, const DurableStoreOptions& options,
    std::vector<DurableRecord>* recovered) {
  const std::shared_ptr<FileSystem> file_system = FileSystemOrDefault(options.file_system);
  if (absl::Status created = file_system->CreateDirectories(directory); !created.ok()) {
    return absl::Status(created.code(), absl::StrCat("durable directory: ", created.message()));
  }
  std::unique_ptr<DurableStore> store(new DurableStore(directory, file_system));
  recovered->clear();
  RETURN_IF_ERROR(store->Recover(recovered));
  return store;
}

DurableStore::DurableStore(std::string directory, std::shared_ptr<FileSystem> file_system)
    : directory_(std::move(directory)), file_system_(std::move(file_system)) {}

DurableStore::~DurableStore() = default;

absl::Status DurableStore::Recover(std::vector<DurableRecord>* recovered) {
  std::map<std::string, DurableRecord> newest;  // by key
  std::vector<std::string> superseded;
  int temporaries = 0;
  uint64_t max_generation = 0;
  absl::StatusOr<std::vector<std::string>> names = file_system_->ListDirectory(directory_);
  if (!names.ok()) {
    return absl::Status(names.status().code(),
                        absl::StrCat("listing ", directory_, ": ", names.status().message()));
  }
  for (const std::string& name : *names) {
    const std::string path = absl::StrCat(directory_, "/", name);
    if (absl::EndsWith(name, kTemporarySuffix)) {
      // A version whose commit was never acknowledged.
      if (file_system_->RemoveFile(path).ok()) ++temporaries;
      continue;
    }
    if (!absl::EndsWith(name, kSuffix)) continue;
    absl::StatusOr<DurableRecord> record = ReadHeader(*file_system_, path);
    if (!record.ok()) {
      const std::string damaged = absl::StrCat(path, kDamagedSuffix);
      TIERD_LOG(ERROR) << "durable object file " << path << " is damaged (" << record.status()
                       << "); moved to " << damaged << " and not loaded";
      (void)file_system_->Rename(path, damaged);
      continue;
    }
    max_generation = std::max(max_generation, record->generation);
    auto [it, inserted] = newest.try_emplace(record->key, *record);
    if (!inserted) {
      // A crash between writing a new version and removing the old one: keep the newer.
      if (record->generation > it->second.generation) {
        superseded.push_back(it->second.path);
        it->second = *std::move(record);
      } else {
        superseded.push_back(path);
      }
    }
  }
  for (const std::string& path : superseded) (void)file_system_->RemoveFile(path);
  if (temporaries > 0 || !superseded.empty()) {
    TIERD_LOG(INFO) << "durable store " << directory_ << ": removed " << temporaries
                    << " unfinished and " << superseded.size() << " superseded version(s)";
    RETURN_IF_ERROR(file_system_->SyncDirectory(directory_));
  }
  absl::MutexLock lock(&mu_);
  next_generation_ = max_generation + 1;
  for (auto& [key, record] : newest) {
    on_disk_[key] = {record.path, record.size};
    ++stats_.objects;
    stats_.bytes += record.size;
    recovered->push_back(std::move(record));
  }
  return absl::OkStatus();
}

void DurableStore::Persist(std::string key, const uint8_t* data, uint64_t size,
                           std::vector<TensorPlacement> tensors, PersistCallback done) {
  Job job;
  job.key = std::move(key);
  job.data = data;
  job.size = size;
  job.tensors = std::move(tensors);
  job.persisted = std::move(done);
  absl::MutexLock lock(&mu_);
  ++persists_queued_[job.key];
  Queue(std::move(job));
}

void DurableStore::Remove(std::string key, RemoveCallback done) {
  Job job;
  job.remove = true;
  job.key = std::move(key);
  job.removed = std::move(done);
  {
    absl::MutexLock lock(&mu_);
    // With nothing on disk and nothing queued that could write it later, there is nothing to do.
    if (on_disk_.count(job.key) > 0 || persists_queued_.count(job.key) > 0) {
      Queue(std::move(job));
      return;
    }
  }
  std::move(job.removed)(absl::OkStatus());
}

absl::Status DurableStore::RemoveAndWait(std::string key) {
  absl::Notification removed;
  absl::Status status;
  Remove(std::move(key), [&](absl::Status result) {
    status = std::move(result);
    removed.Notify();
  });
  removed.WaitForNotification();
  return status;
}

DurableStoreStats DurableStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void DurableStore::Queue(Job job) {
  // Posted under mu_, so that jobs run in the order persists_queued_ and on_disk_ saw them.
  worker_.Post([this, job = std::move(job)]() mutable {
    if (job.remove) {
      RunRemove(job);
    } else {
      RunPersist(job);
    }
  });
}

void DurableStore::RunPersist(Job& job) {
  DurableRecord record;
  record.key = job.key;
  record.size = job.size;
  record.tensors = std::move(job.tensors);
  record.checksum = ObjectChecksum(job.data, job.size);
  std::string previous;
  {
    absl::MutexLock lock(&mu_);
    record.generation = next_generation_++;
    if (auto it = on_disk_.find(job.key); it != on_disk_.end()) previous = it->second.path;
  }
  const std::string base = absl::StrCat(directory_, "/", BaseName(job.key, record.generation));
  record.path = absl::StrCat(base, kSuffix);
  const std::string temporary = absl::StrCat(base, kTemporarySuffix);
  const std::string metadata = Metadata(record).dump();
  record.payload_offset = RoundUpToPage(kFixedHeaderBytes + metadata.size());
  absl::Status status = WriteVersion(job, record, metadata, temporary);
  if (status.ok() && !previous.empty()) {
    if (absl::Status removed = file_system_->RemoveFile(previous);
        !removed.ok() && !absl::IsNotFound(removed)) {
      // The new version is durable and newer: a restart keeps it and removes this one.
      TIERD_LOG(WARNING) << "removing the previous version " << previous << " of " << job.key
                         << ": " << removed;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (--persists_queued_[job.key] == 0) persists_queued_.erase(job.key);
    if (status.ok()) {
      auto [it, inserted] = on_disk_.try_emplace(job.key);
      if (inserted) {
        ++stats_.objects;
      } else {
        stats_.bytes -= it->second.size;
      }
      it->second = {record.path, record.size};
      stats_.bytes += record.size;
    } else {
      ++stats_.persist_failures;
    }
  }
  if (!status.ok()) {
    TIERD_LOG(WARNING) << "persisting " << job.key << " failed: " << status;
    std::move(job.persisted)(absl::Status(
        status.code(), absl::StrCat("writing durable object ", job.key, ": ", status.message())));
    return;
  }
  std::move(job.persisted)(std::move(record));
}

absl::Status DurableStore::WriteVersion(const Job& job, const DurableRecord& record,
                                        const std::string& metadata, const std::string& temporary) {
  std::string header(record.payload_offset, '\0');
  auto* bytes = reinterpret_cast<uint8_t*>(header.data());
  std::memcpy(bytes, kMagic, sizeof(kMagic));
  PutLittleEndian(bytes + 8, metadata.size(), 4);
  PutLittleEndian(bytes + 16, XXH3_64bits(metadata.data(), metadata.size()), 8);
  std::memcpy(bytes + kFixedHeaderBytes, metadata.data(), metadata.size());
  const absl::string_view parts[] = {
      header, absl::string_view(reinterpret_cast<const char*>(job.data), job.size)};
  return WriteFileAtomically(*file_system_, record.path, temporary, parts, 0600);
}

void DurableStore::RunRemove(Job& job) {
  std::string path;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = on_disk_.find(job.key); it != on_disk_.end()) path = it->second.path;
  }
  absl::Status status;
  if (!path.empty()) {
    status = file_system_->RemoveFile(path);
    if (status.ok() || absl::IsNotFound(status)) {
      status = file_system_->SyncDirectory(directory_);
      absl::MutexLock lock(&mu_);
      auto it = on_disk_.find(job.key);
      --stats_.objects;
      stats_.bytes -= it->second.size;
      on_disk_.erase(it);
    }
  }
  std::move(job.removed)(status);
}

}  // namespace tierd
