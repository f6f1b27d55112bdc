// What a registered model is: its files, the objects its tensors are grouped into, where each
// object's bytes are in the files, and the index of the tensors inside each object. Plain values,
// shared by the catalog (which registers and persists them), the layout and scan code that builds
// them, the tiers that read objects, and the durable store that records stored objects' tensors.
//
// Keys are "MODEL/OBJECT"; with per-tensor grouping the object name is the tensor name
// ("m/blocks.3.ffn.up.weight").
#ifndef TIERD_STORAGE_MODEL_H_
#define TIERD_STORAGE_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "remote/s3_location.h"
#include "storage/dtype.h"

namespace tierd {

enum class Grouping { kTensor, kBlock, kPhase };

// "tensor", "block", "phase" ↔ Grouping.
std::optional<Grouping> ParseGrouping(absl::string_view name);
const char* GroupingName(Grouping grouping);

// How tensor names map to blocks and phases. Patterns are RE2 regular expressions.
struct GroupingRules {
  // Each pattern must have exactly one capture group: the block prefix to use as the object name.
  // The first pattern that finds a match in a tensor name (RE2::PartialMatch) wins. Default:
  // "^(.*?(?:blocks|layers|h)\.\d+)\." — so "model.layers.3.mlp.up.weight" is in block
  // "model.layers.3". Tensors in no block form objects of their own, named by the tensor.
  std::vector<std::string> block_patterns;
  // (phase name, pattern) pairs matched, in order, against the rest of a block tensor's name after
  // "<block prefix>."; the first match names the phase ("<block prefix>.<phase>"). A block tensor
  // matching none is in phase "other". Defaults cover cross_attn, attn, ffn and norm in common
  // layouts.
  std::vector<std::pair<std::string, std::string>> phase_patterns;

  static GroupingRules Defaults();
};

// One tensor inside an object.
struct TensorPlacement {
  std::string name;  // the tensor's full name in the safetensors files
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;  // byte offset inside the object
  uint64_t size = 0;    // bytes
};

// Bytes [file_offset, file_offset + length) of files[file] land at object_offset in the object.
struct Extent {
  uint32_t file = 0;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  uint64_t object_offset = 0;
};

// Rows of bytes copied from one object into another: for r in [0, rows), bytes
// [src_offset + r * src_pitch, + width) land at [dst_offset + r * dst_pitch, + width).
struct StridedRange {
  uint64_t src_offset = 0;
  uint64_t src_pitch = 0;
  uint64_t dst_offset = 0;
  uint64_t dst_pitch = 0;
  uint64_t width = 0;
  uint64_t rows = 1;
};

struct ObjectInfo {
  std::string name;  // within the model
  uint64_t size = 0;
  std::vector<TensorPlacement> tensors;  // in object order
  std::vector<Extent> extents;           // sorted by (file, file_offset); adjacent ones merged
  // A shard (storage/model/shard.h) is cut from another object of its model: `base` names it and
  // `from_base` says which of its bytes land where in the shard (together, every byte of the
  // shard's tensors; not the alignment gaps between them). Both empty for any other object.
  std::string base;
  std::vector<StridedRange> from_base;
};

// A model file as registration found it. Every open of it must find the same file (CheckModelFile
// in model_scan.h): a changed file makes reads fail, not lie.
struct ModelFile {
  std::string path;  // absolute, every symbolic link resolved
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  // st_dev and st_ino; both 0 in a catalog written before they were recorded, until its next load
  // records them.
  uint64_t device = 0;
  uint64_t inode = 0;
  // A remote file's (an s3:// path): its ETag when registered, which every read must still find.
  // Empty for local files.
  std::string etag;
  // Where a file of an object store is, parsed from `path` once (registration, or the catalog's
  // load: ParseModelLocation); unset for a local file.
  std::optional<S3Url> object;
};

struct ModelInfo {
  std::string name;
  std::string directory;  // absolute, or an object store's URL
  // The directory (and so every file) is an object store's.
  bool in_object_store = false;
  Grouping grouping = Grouping::kBlock;
  std::vector<ModelFile> files;
  std::vector<ObjectInfo> objects;  // sorted by name
  uint64_t total_bytes = 0;         // sum of object sizes
  // How many of its tensors are derived from the checkpoint's (storage/model/derived_tensors.h): a
  // model registered with a checkpoint conversion has them, one registered as stored has none.
  size_t derived_tensors = 0;
  // Registered with compression off (RegisterModel's keep_raw): its objects stay raw in host
  // memory whatever the daemon's --compress-weights says.
  bool keep_raw = false;
};

struct ModelSummary {
  std::string name;
  std::string directory;
  Grouping grouping = Grouping::kBlock;
  size_t files = 0;
  size_t objects = 0;
  size_t tensors = 0;
  size_t derived_tensors = 0;
  uint64_t total_bytes = 0;
  bool keep_raw = false;
  // Non-empty when a file changed since registration: why its objects cannot be read.
  std::string stale;
};

// Progress of a registration, reported after each file's header is parsed and, when the model is
// verified, as its bytes are hashed.
struct RegistrationProgress {
  size_t files_done = 0;
  size_t files_total = 0;
  std::string current_file;
  uint64_t bytes_verified = 0;
  uint64_t bytes_to_verify = 0;  // 0 unless verifying
};

// A model with more tensors than this is refused (tierd --max-tensors-per-model): the largest
// published models have under 100,000, and every tensor costs memory in the catalog and the tiers.
inline constexpr size_t kDefaultMaxTensorsPerModel = 131072;

// An object looked up by key; keeps its model's description alive.
struct ObjectRef {
  std::shared_ptr<const ModelInfo> model;
  const ObjectInfo* object = nullptr;  // in `model`, or `shard`
  std::string key;                     // "MODEL/OBJECT" or "MODEL/OBJECT@DIM:INDEX/COUNT"
  // Owns the object when the key names a shard (storage/model/shard.h): made at lookup, not in
  // `model`.
  std::shared_ptr<const ObjectInfo> shard;

  // The object's tensors, kept alive by what owns the object.
  std::shared_ptr<const std::vector<TensorPlacement>> tensors() const;
};

// Splits "MODEL/OBJECT" at the first '/'. INVALID_ARGUMENT when either side is empty or the model
// name is not valid.
absl::StatusOr<std::pair<std::string, std::string>> SplitObjectKey(absl::string_view key);
// Model names: 1–128 characters of [A-Za-z0-9._-], not starting with '.'.
absl::Status ValidateModelName(absl::string_view name);

// The object of `info` named `name` (binary search: info.objects is sorted by name); null when
// there is none.
const ObjectInfo* FindObject(const ModelInfo& info, absl::string_view name);

// Where `object`'s bytes come from, as a 64-bit fingerprint (never 0): its size and, for each
// extent, the file's identity (device and inode where recorded, else its path and, for a remote
// file, its ETag; size; mtime) and the extent's place. Two daemons that registered the object from
// the same files compute the same fingerprint; from other files (another copy, another version), a
// different one.
uint64_t ObjectSourceFingerprint(const ModelInfo& model, const ObjectInfo& object);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_H_
