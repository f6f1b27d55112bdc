// Tensor-parallel shards of an object: rank `index` of `count`'s slice of each tensor along `dim`,
// as torch.tensor_split(tensor, count, dim)[index] gives it, made an object of its own.
//
// A shard is named by a suffix on its object's name: "MODEL/OBJECT@DIM:INDEX/COUNT". Its tensors
// are those of the object in the same order, each split along `dim` when it has more than `dim`
// dimensions and copied whole otherwise (a row-parallel layer's bias, a norm's weight when dim is
// 1), at kGatheredTensorAlignment inside the shard. Its extents are the byte ranges of the model's
// files that hold exactly those slices: one range per tensor for dim 0, one per row of the
// dimensions before `dim` otherwise. So the tiers read, checksum, hold and lend a shard like any
// object, and only the blocks holding those ranges are read.
//
// Uneven splits follow tensor_split: of n rows in count parts, the first n % count parts have one
// row more.
//
// A fused tensor — several segments stacked along `dim`, such as q, k and v along dimension 0, or
// gate and up — is named "MODEL/OBJECT@DIM:INDEX/COUNT:S1,S2,...", S the segments' sizes along
// `dim` (2 to 64 of them, adding up to the tensor's size there): each segment is split as above,
// and the shard holds the rank's slice of each, in order (torch.cat of tensor_split of each
// segment), as the rank's module expects its fused parameter.
//
// A shard also says how it is cut from its object's bytes (ObjectInfo::base and from_base): the
// GPU tier copies it straight out of the whole object in host memory when that serves the node
// better than reading the shard's own ranges (CutShardFromObject).
//
// Pure computation: no I/O, no locking. Thread-compatible.
#ifndef TIERD_STORAGE_MODEL_SHARD_H_
#define TIERD_STORAGE_MODEL_SHARD_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/model.h"

namespace tierd {

// Rows [first, first + count) of `rows` split in `parts` that part `index` gets (tensor_split).
// REQUIRES: index < parts.
std::pair<uint64_t, uint64_t> ShardRows(uint64_t rows, uint32_t index, uint32_t parts);

// The shard of `model` that `object_name` ("OBJECT@DIM:INDEX/COUNT[:S1,S2,...]") names. NOT_FOUND
// when the name has no '@', OBJECT is not an object of the model, or what follows the '@' has
// neither ':' nor '/'; INVALID_ARGUMENT when the spec is malformed, not written canonically (no
// leading zeros, no single segment: one shard has one key), or does not fit the object: count 0,
// index >= count, no tensor with dimension DIM, a split tensor (or segment) with fewer rows than
// count there, segments that do not add up to a split tensor's size, more than 262,144 separate
// file ranges (one per row of the dimensions before DIM), or a layout whose disk reads
// (DiskBytesToRead) would be more than 64 times its bytes and more than its bytes and 16 MiB: a
// narrow slice along a high dimension of a wide tensor reads every row's blocks. An object of the
// model whose own name looks like a shard's is found by FindObject first: it is that object.
absl::StatusOr<ObjectInfo> FindShard(const ModelInfo& model, absl::string_view object_name);

// Whether to copy `shard` out of its whole object's bytes in host memory (`object_size` bytes;
// `object_in_host_memory` when they are there already) rather than read the shard's own file
// ranges. Always when the object is in host memory already. Otherwise when the shard is strided
// (rows narrower than their pitch: read alone, it reads the blocks its neighbouring ranks' shards
// read too, once per rank, where the object read once serves them all), and reading the whole
// object reads no more per byte of the shard than FindShard lets a shard's own reads.
bool CutShardFromObject(const ObjectInfo& shard, uint64_t object_size, bool object_in_host_memory);

// True when `object_name` is OBJECT@SPEC with OBJECT an object of `model` and SPEC written
// canonically; whether the spec fits the object is not checked.
bool IsShardName(const ModelInfo& model, absl::string_view object_name);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_SHARD_H_
