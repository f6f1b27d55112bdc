// Reading a model directory for registration: which .safetensors files make up the model (exactly
// those model.safetensors.index.json names, or else every one in the directory), each file's size
// and mtime, and where every tensor is, with the index cross-checked against the files' headers.
// Also the later check that those files are still as they were.
//
// Only reads the file system. Stateless; thread-safe.
#ifndef TIERD_STORAGE_MODEL_SCAN_H_
#define TIERD_STORAGE_MODEL_SCAN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/catalog.h"
#include "storage/model_roots.h"
#include "storage/object_layout.h"

namespace tierd {

inline constexpr char kSafetensorsIndexFileName[] = "model.safetensors.index.json";
// Real indexes are well under a megabyte; this only bounds what a broken one can cost.
inline constexpr uint64_t kMaxSafetensorsIndexBytes = 64ull << 20;

struct ScannedModel {
  std::string directory;         // absolute, normalized
  std::vector<ModelFile> files;  // sorted by file name
  std::vector<SourceTensor> tensors;
};

// Scans `directory` (relative to the working directory unless absolute), calling `progress` (when
// set) after each file's header is parsed. Errors: NOT_FOUND when there is no such directory or
// no .safetensors file in it; INVALID_ARGUMENT for a malformed header or index, a tensor in two
// files, or an index that names a path instead of a bare file name, lists a tensor in a file that
// does not hold it, or leaves out a tensor the files hold — naming the tensor and files;
// DATA_LOSS for a truncated file; UNAVAILABLE when a file changed while it was read; I/O errors.
// The directory, the index and each file are checked against `roots` before they are read
// (ModelRoots::Check's errors).
absl::StatusOr<ScannedModel> ScanModelDirectory(
    const std::string& directory, const std::function<void(const RegistrationProgress&)>& progress,
    const ModelRoots& roots = ModelRoots());

// "" when every file still has the size and mtime recorded in `files`; otherwise a sentence
// naming the first one that does not and how it changed.
std::string DescribeChangedFile(const std::vector<ModelFile>& files);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_SCAN_H_
