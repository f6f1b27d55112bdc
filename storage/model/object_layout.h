// How a model's tensors become objects: which object each tensor belongs to (by the grouping rules)
// and where each tensor lands inside its object (the layout). Used by the catalog when it
// registers a model, and to check a layout read back from disk before trusting it.
//
// Pure computation over names and offsets: no I/O, no locking. Thread-compatible.
#ifndef TIERD_STORAGE_MODEL_OBJECT_LAYOUT_H_
#define TIERD_STORAGE_MODEL_OBJECT_LAYOUT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "re2/re2.h"
#include "storage/dtype.h"
#include "storage/model.h"

namespace tierd {

// Tensors of a gathered object start at multiples of this inside the object: the alignment
// cudaMalloc gives, so a tensor's device address is as aligned as if it had its own allocation.
inline constexpr uint64_t kGatheredTensorAlignment = 256;

// One tensor as found in a model file, before grouping.
struct SourceTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint32_t file = 0;   // index into the model's files
  uint64_t begin = 0;  // absolute byte offset in that file
  uint64_t end = 0;    // one past the last byte
  // A derived tensor gathered from several ranges (storage/model/derived_tensors.h): the ranges in
  // the tensor's order, back to back, object_offset counted from the tensor's first byte. Empty for
  // a tensor that is one file range; when not, file, begin and end are the first piece's.
  std::vector<Extent> pieces;

  uint64_t size() const {
    return pieces.empty() ? end - begin : pieces.back().object_offset + pieces.back().length;
  }
};

// Maps tensor names to object names for one grouping, with its rules compiled once.
class ObjectGrouper {
 public:
  // INVALID_ARGUMENT when a pattern the grouping uses does not compile, a block pattern does not
  // have exactly one capture group, or a phase name is empty.
  static absl::StatusOr<ObjectGrouper> Create(Grouping grouping, const GroupingRules& rules);

  ObjectGrouper(ObjectGrouper&&) = default;
  ObjectGrouper& operator=(ObjectGrouper&&) = default;

  // The object `tensor_name` belongs to. Never empty for a non-empty tensor name.
  std::string ObjectNameFor(absl::string_view tensor_name) const;

 private:
  explicit ObjectGrouper(Grouping grouping) : grouping_(grouping) {}

  Grouping grouping_;
  std::vector<std::unique_ptr<RE2>> block_patterns_;
  std::vector<std::pair<std::string, std::unique_ptr<RE2>>> phase_patterns_;
};

// Why `tensor` cannot sit in an object of `object_size` bytes: its size does not match its dtype
// and shape, or its bytes are outside the object (INVALID_ARGUMENT, without the tensor's name).
absl::Status CheckPlacement(const TensorPlacement& tensor, uint64_t object_size);

// Lays out one object from its tensors (any order): one file range when they are back to back in
// one file (and none is gathered from pieces), otherwise gathered at kGatheredTensorAlignment. See
// catalog.h for the result's shape.
ObjectInfo LayOutObject(std::string name, std::vector<SourceTensor> tensors);

// Groups `tensors` with `grouper` and lays out each object; the result is sorted by name.
std::vector<ObjectInfo> BuildObjects(const ObjectGrouper& grouper,
                                     std::vector<SourceTensor> tensors);

// Checks that `object`, read back from a persisted catalog, is self-consistent and refers only to
// bytes inside `files` (as their sizes were recorded): placements inside the object and matching
// dtype × shape, extents non-empty, inside their file and the object, sorted and not overlapping.
// INVALID_ARGUMENT naming the object otherwise.
absl::Status ValidateObject(const ObjectInfo& object, const std::vector<ModelFile>& files);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_OBJECT_LAYOUT_H_
