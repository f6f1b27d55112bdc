// Derived tensors: tensors of a model made of byte ranges of its checkpoint's tensors, as a
// checkpoint conversion that only moves bytes makes them — a rename (one whole tensor), experts
// stacked into one fused parameter (whole tensors one after another), a concatenation along a
// later dimension (one range of each source per row of the dimensions before it), a split (a
// range of one source). transformers' conversion mapping describes such conversions; a client
// (python/tierd/conversions.py) turns it into derived tensors and registers the model with them,
// so the daemon serves each fused parameter as the module expects it: its ranges read once from
// disk and gathered into one object, with no copy on the client.
//
// A derived tensor replaces the checkpoint tensors its ranges come from: they are no longer
// tensors of the model. Its ranges are laid out back to back, in order, with no padding; the
// tensor is then grouped into objects like any other, by its name. A zero-size checkpoint tensor a
// conversion takes is named by a range of no bytes (offset 0, length 0), which replaces it and
// adds nothing.
//
// Pure computation over the scanned tensors: no I/O, no locking. Thread-compatible.
#ifndef TIERD_STORAGE_MODEL_DERIVED_TENSORS_H_
#define TIERD_STORAGE_MODEL_DERIVED_TENSORS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "storage/dtype.h"
#include "storage/model/object_layout.h"

namespace tierd {

// Bytes [offset, offset + length) of checkpoint tensor `tensor` (its own bytes, counted from its
// first).
struct TensorRange {
  std::string tensor;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct DerivedTensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  std::vector<TensorRange> ranges;  // concatenated in this order, they are the tensor's bytes
};

// A derived tensor may be gathered from at most this many ranges (after adjacent ranges are
// merged): a concatenation along a late dimension of a wide tensor makes one per row, and every
// range is a separate read and copy. The same bound as a shard's ranges (storage/model/shard.h).
inline constexpr size_t kMaxRangesPerDerivedTensor = 262144;
// And a model at most this many in all.
inline constexpr size_t kMaxDerivedRangesPerModel = 16 * kMaxRangesPerDerivedTensor;

// Replaces in `tensors` (a scanned model's) every tensor a spec takes bytes from by the specs'
// tensors. A derived tensor gathered from one range is a SourceTensor of that range (a rename);
// from several, its `pieces` say where each lands. INVALID_ARGUMENT, naming the derived tensor,
// when a name is empty, longer than a checkpoint's may be (4096 bytes) or already taken (by a
// tensor the specs leave in place, or another spec), the shape has more than 64 dimensions, a
// range is empty (but for a zero-size tensor's), names no tensor of the checkpoint or passes its
// end, the ranges are not all
// of the spec's dtype, their bytes do not add up to dtype × shape, two ranges (of any specs)
// overlap, or there are more ranges than the bounds above. On error `tensors` is unchanged.
absl::Status ApplyDerivedTensors(const std::vector<DerivedTensorSpec>& specs,
                                 std::vector<SourceTensor>& tensors);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_DERIVED_TENSORS_H_
