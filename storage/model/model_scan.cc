#include "storage/model/model_scan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/directory.h"
#include "common/posix_error.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "storage/model/json_file.h"
#include "storage/model/safetensors_header.h"

namespace tierd {
namespace {

absl::StatusOr<struct stat> Stat(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return PosixError(path, errno);
  return st;
}

absl::StatusOr<struct stat> FStat(int fd, const std::string& path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return PosixError(absl::StrCat("stat ", path), errno);
  return st;
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

absl::Status WithFileNamed(const absl::Status& status, const std::string& path) {
  if (status.ok() || absl::StrContains(status.message(), path)) return status;
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

absl::StatusOr<std::string> AbsoluteDirectory(const std::string& directory) {
  if (directory.empty()) return absl::InvalidArgumentError("model directory is empty");
  std::error_code error;
  std::filesystem::path path = std::filesystem::absolute(directory, error);
  if (error) return PosixError(absl::StrCat("resolving ", directory), error.value());
  std::string normal = path.lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

// The index read from the file `path` resolves to, opened beneath its root without following
// links.
absl::StatusOr<std::map<std::string, std::string>> ReadIndex(const std::string& path,
                                                             const ModelRoots& roots) {
  ASSIGN_OR_RETURN(const std::string resolved, roots.Resolve(path));
  ASSIGN_OR_RETURN(const ScopedFd fd, roots.OpenBeneath(resolved, O_RDONLY));
  ASSIGN_OR_RETURN(const std::string text,
                   ReadFileBounded(fd.get(), path, kMaxSafetensorsIndexBytes));
  return ParseSafetensorsIndex(text, path);
}

// The regular files named *.safetensors in `dir`, sorted.
absl::StatusOr<std::vector<std::string>> ListSafetensorsFiles(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ListDirectory(dir));
  std::vector<std::string> files;
  for (const std::string& name : names) {
    if (!IsSafetensorsFileName(name)) continue;
    // stat, not the dirent type: model snapshots (Hugging Face's cache) are symlinks to blobs.
    auto st = Stat(absl::StrCat(dir, "/", name));
    if (st.ok() && S_ISREG(st->st_mode)) files.push_back(name);
  }
  return files;
}

absl::StatusOr<ScannedModel> ScanModelDirectoryIn(
    const std::string& dir, const std::function<void(const RegistrationProgress&)>& progress,
    const ModelRoots& roots, size_t max_tensors) {
  RETURN_IF_ERROR(roots.Check(dir));
  ASSIGN_OR_RETURN(const struct stat dir_stat, Stat(dir));
  if (!S_ISDIR(dir_stat.st_mode)) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  }
  const std::string index_path = absl::StrCat(dir, "/", kSafetensorsIndexFileName);
  std::optional<std::map<std::string, std::string>> weight_map;
  std::vector<std::string> file_names;
  if (access(index_path.c_str(), F_OK) == 0) {
    ASSIGN_OR_RETURN(weight_map, ReadIndex(index_path, roots));
    std::set<std::string> distinct;
    for (const auto& [tensor, file] : *weight_map) distinct.insert(file);
    file_names.assign(distinct.begin(), distinct.end());
  } else {
    ASSIGN_OR_RETURN(file_names, ListSafetensorsFiles(dir));
    if (file_names.empty()) {
      return absl::NotFoundError(absl::StrCat("no .safetensors files in ", dir));
    }
  }

  ScannedModel scanned;
  scanned.directory = dir;
  std::map<std::string, uint32_t> tensor_file;
  for (uint32_t i = 0; i < file_names.size(); ++i) {
    const std::string path = absl::StrCat(dir, "/", file_names[i]);
    // Recorded resolved (model snapshots are often links to blobs), and read from a descriptor
    // opened without following links: what is parsed is what later opens must find.
    ASSIGN_OR_RETURN(const std::string resolved, roots.Resolve(path));
    ASSIGN_OR_RETURN(const ScopedFd fd, roots.OpenBeneath(resolved, O_RDONLY));
    ASSIGN_OR_RETURN(const struct stat before, FStat(fd.get(), path));
    auto header = ReadSafetensorsHeader(fd.get(), path, max_tensors - scanned.tensors.size());
    if (IsTensorLimit(header.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model in ", Quote(dir), " has more than ", max_tensors,
                       " tensors, the limit (--max-tensors-per-model)"));
    }
    if (!header.ok()) return WithFileNamed(header.status(), path);
    ASSIGN_OR_RETURN(const struct stat after, FStat(fd.get(), path));
    // The recorded size and mtime vouch for the offsets just parsed; a file rewritten meanwhile
    // would make them vouch for bytes nobody checked.
    if (before.st_size != after.st_size || MtimeNs(before) != MtimeNs(after)) {
      return absl::UnavailableError(absl::StrCat(path, " changed while it was being registered"));
    }
    RETURN_IF_ERROR(AddFileTensors(*std::move(header), i, file_names, tensor_file, scanned));
    scanned.files.push_back(ModelFile{resolved, static_cast<uint64_t>(after.st_size),
                                      MtimeNs(after), static_cast<uint64_t>(after.st_dev),
                                      static_cast<uint64_t>(after.st_ino)});
    if (progress) progress(RegistrationProgress{i + 1u, file_names.size(), path});
  }
  if (weight_map.has_value()) {
    RETURN_IF_ERROR(CheckIndexAgainstFiles(*weight_map, file_names, tensor_file, index_path));
  }
  return scanned;
}

}  // namespace

bool IsSafetensorsFileName(absl::string_view name) {
  constexpr absl::string_view kSuffix = ".safetensors";
  return name.size() > kSuffix.size() && absl::EndsWith(name, kSuffix);
}

absl::StatusOr<std::map<std::string, std::string>> ParseSafetensorsIndex(absl::string_view text,
                                                                         const std::string& path) {
  const std::optional<nlohmann::json> index = ParseBoundedJson(text);
  if (!index.has_value()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  const nlohmann::json* weight_map = JsonMember(&*index, "weight_map");
  if (!JsonIsObject(weight_map)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"weight_map\" object"));
  }
  std::map<std::string, std::string> files;
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    std::string file;
    if (!JsonString(&it.value(), &file)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", Quote(it.key()),
                                                     " maps to something other than a file name"));
    }
    // The index is untrusted: a path would let it point registration at files outside the model.
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", Quote(it.key()),
                                                     " maps to ", Quote(file),
                                                     ", which is not a bare file name"));
    }
    files.emplace(it.key(), std::move(file));
  }
  if (files.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": weight_map is empty"));
  return files;
}

absl::Status CheckIndexAgainstFiles(const std::map<std::string, std::string>& weight_map,
                                    const std::vector<std::string>& file_names,
                                    const std::map<std::string, uint32_t>& tensor_file,
                                    const std::string& index_path) {
  for (const auto& [tensor, file] : weight_map) {
    auto found = tensor_file.find(tensor);
    if (found == tensor_file.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, ": tensor '", tensor, "' is listed in ", file, ", which does not hold it"));
    }
    if (file_names[found->second] != file) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor '", tensor,
                                                     "' is listed in ", file, " but is in ",
                                                     file_names[found->second]));
    }
  }
  for (const auto& [tensor, file] : tensor_file) {
    if (weight_map.count(tensor) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor, "' in ", file_names[file],
                                                     " is not in the weight_map of ", index_path));
    }
  }
  return absl::OkStatus();
}

absl::Status AddFileTensors(SafetensorsHeader header, uint32_t file,
                            const std::vector<std::string>& file_names,
                            std::map<std::string, uint32_t>& tensor_file, ScannedModel& scanned) {
  for (SafetensorsTensor& tensor : header.tensors) {
    auto [it, inserted] = tensor_file.emplace(tensor.name, file);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(tensor.name), " is in both ",
                                                     file_names[it->second], " and ",
                                                     file_names[file]));
    }
    scanned.tensors.push_back(SourceTensor{std::move(tensor.name), tensor.dtype,
                                           std::move(tensor.shape), file, tensor.begin,
                                           tensor.end});
  }
  return absl::OkStatus();
}

absl::StatusOr<ScannedModel> ScanModelDirectory(
    const std::string& directory, const std::function<void(const RegistrationProgress&)>& progress,
    const ModelRoots& roots, size_t max_tensors) {
  ASSIGN_OR_RETURN(const std::string dir, AbsoluteDirectory(directory));
  return ScanModelDirectoryIn(dir, progress, roots, max_tensors);
}

absl::Status CheckModelFile(int fd, const ModelFile& file) {
  ASSIGN_OR_RETURN(const struct stat st, FStat(fd, file.path));
  std::string change;
  if (!S_ISREG(st.st_mode)) {
    change = "is no longer a regular file";
  } else if (file.inode != 0 && (static_cast<uint64_t>(st.st_dev) != file.device ||
                                 static_cast<uint64_t>(st.st_ino) != file.inode)) {
    change = "was replaced by another file";
  } else if (static_cast<uint64_t>(st.st_size) != file.size) {
    change = absl::StrCat("changed size from ", file.size, " to ", st.st_size, " bytes");
  } else if (MtimeNs(st) != file.mtime_ns) {
    change = "was modified";
  } else {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(file.path, " ", change, " since it was registered"));
}

absl::StatusOr<ScopedFd> OpenModelFile(const ModelRoots& roots, const ModelFile& file, int flags) {
  ASSIGN_OR_RETURN(ScopedFd fd, roots.OpenBeneath(file.path, flags));
  RETURN_IF_ERROR(CheckModelFile(fd.get(), file));
  return fd;
}

bool RecordMissingIdentity(const ModelRoots& roots, ModelFile& file) {
  if (file.inode != 0) return false;
  absl::StatusOr<std::string> resolved = roots.Resolve(file.path);
  if (!resolved.ok()) return false;
  absl::StatusOr<ScopedFd> fd = roots.OpenBeneath(*resolved, O_RDONLY);
  if (!fd.ok()) return false;
  absl::StatusOr<struct stat> st = FStat(fd->get(), *resolved);
  if (!st.ok() || !S_ISREG(st->st_mode) || static_cast<uint64_t>(st->st_size) != file.size ||
      MtimeNs(*st) != file.mtime_ns) {
    return false;
  }
  file.path = *std::move(resolved);
  file.device = static_cast<uint64_t>(st->st_dev);
  file.inode = static_cast<uint64_t>(st->st_ino);
  return true;
}

std::string DescribeChangedFile(const std::vector<ModelFile>& files, const ModelRoots& roots) {
  for (const ModelFile& file : files) {
    absl::StatusOr<ScopedFd> fd = OpenModelFile(roots, file, O_RDONLY);
    if (absl::IsFailedPrecondition(fd.status())) return std::string(fd.status().message());
    if (!fd.ok()) {
      return absl::StrCat(file.path, " can no longer be read (", fd.status().message(), ")");
    }
  }
  return "";
}

}  // namespace tierd
