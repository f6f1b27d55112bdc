// Reading a model directory for registration: which .safetensors files make up the model (exactly
// those model.safetensors.index.json names, or else every one in the directory), each file's size
// and mtime, and where every tensor is, with the index cross-checked against the files' headers.
// Also the later check that those files are still as they were.
//
// Only reads the file system. Stateless; thread-safe.
#ifndef TIERD_STORAGE_MODEL_MODEL_SCAN_H_
#define TIERD_STORAGE_MODEL_MODEL_SCAN_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/fd_io.h"
#include "storage/model.h"
#include "storage/model/object_layout.h"
#include "storage/model/safetensors_header.h"
#include "storage/model_roots.h"

namespace tierd {

inline constexpr char kSafetensorsIndexFileName[] = "model.safetensors.index.json";

// Whether a model directory's (or prefix's) entry `name` is a weights file: "X.safetensors".
bool IsSafetensorsFileName(absl::string_view name);
// Real indexes are well under a megabyte; this only bounds what a broken one can cost.
inline constexpr uint64_t kMaxSafetensorsIndexBytes = 64ull << 20;

struct ScannedModel {
  std::string directory;         // absolute, normalized
  std::vector<ModelFile> files;  // sorted by file name; paths resolved
  std::vector<SourceTensor> tensors;
};

// Scans `directory` (relative to the working directory unless absolute), calling `progress` (when
// set) after each file's header is parsed. Errors: NOT_FOUND when there is no such directory or
// no .safetensors file in it; INVALID_ARGUMENT for a malformed header or index, a tensor in two
// files, more than `max_tensors` tensors in all, or an index that names a path instead of a bare
// file name, lists a tensor in a file that does not hold it, or leaves out a tensor the files
// hold — naming the tensor and files; DATA_LOSS for a truncated file; UNAVAILABLE when a file
// changed while it was read; I/O errors. The directory, the index and each file are checked
// against `roots` before they are read (ModelRoots::Check's errors), and each file is recorded by
// its resolved path, device, inode, size and mtime, read from the descriptor its header was read
// from (opened with ModelRoots::OpenBeneath).
absl::StatusOr<ScannedModel> ScanModelDirectory(
    const std::string& directory, const std::function<void(const RegistrationProgress&)>& progress,
    const ModelRoots& roots = ModelRoots(),
    size_t max_tensors = std::numeric_limits<size_t>::max());

// The weight_map of a model.safetensors.index.json read from `path`: tensor name → file name,
// every file a bare name inside the model's directory (the index is untrusted). INVALID_ARGUMENT
// naming `path` for anything else.
absl::StatusOr<std::map<std::string, std::string>> ParseSafetensorsIndex(absl::string_view text,
                                                                         const std::string& path);

// OK when every tensor of `weight_map` is in the file it names (`file_names[tensor_file[t]]`) and
// every tensor the files hold is in it; INVALID_ARGUMENT naming the tensor and files otherwise.
absl::Status CheckIndexAgainstFiles(const std::map<std::string, std::string>& weight_map,
                                    const std::vector<std::string>& file_names,
                                    const std::map<std::string, uint32_t>& tensor_file,
                                    const std::string& index_path);

// Adds `header`'s tensors, those of file `file_names[file]`, to `scanned` and records each in
// `tensor_file`. INVALID_ARGUMENT naming both files for a tensor another file already holds.
absl::Status AddFileTensors(SafetensorsHeader header, uint32_t file,
                            const std::vector<std::string>& file_names,
                            std::map<std::string, uint32_t>& tensor_file, ScannedModel& scanned);

// OK when the open file `fd` is still the file registration recorded as `file`: a regular file
// with the same device, inode (when recorded), size and mtime. FAILED_PRECONDITION naming the file
// and what changed otherwise ("...; drop and re-register the model").
absl::Status CheckModelFile(int fd, const ModelFile& file);

// Opens model file `file` with `flags` beneath its root (ModelRoots::OpenBeneath: no symbolic
// link followed) and checks it with CheckModelFile. Errors: those two's.
absl::StatusOr<ScopedFd> OpenModelFile(const ModelRoots& roots, const ModelFile& file, int flags);

// For a file recorded before devices and inodes were (both 0): when the file its path resolves
// to, inside `roots`, still has the recorded size and mtime, records that path, device and inode
// and returns true. Otherwise leaves `file` alone (DescribeChangedFile then says why).
bool RecordMissingIdentity(const ModelRoots& roots, ModelFile& file);

// "" when every file in `files` can still be opened by OpenModelFile; otherwise a sentence naming
// the first one that cannot and why (changed, replaced, a link now, outside the roots, gone).
std::string DescribeChangedFile(const std::vector<ModelFile>& files,
                                const ModelRoots& roots = ModelRoots());

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_MODEL_SCAN_H_
