// The checksum of a model object: xxHash3 (64 bits) over its bytes, the alignment gaps between
// gathered tensors counted as zeros. The host cache computes it on every read from disk and
// compares it with the one the catalog recorded; registration with verification
// (`tierctl load --verify`) computes every object's from the files before the model is registered,
// so that even the first read is checked.
//
// Stateless; thread-safe.
#ifndef TIERD_STORAGE_MODEL_OBJECT_CHECKSUM_H_
#define TIERD_STORAGE_MODEL_OBJECT_CHECKSUM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "storage/model.h"
#include "storage/model_roots.h"

namespace tierd {

// Calls `gap(begin, end)` for each range of `object`'s bytes that no extent covers (the gaps the
// layout leaves between gathered tensors, and any tail), in object order.
void ForEachObjectGap(const ObjectInfo& object,
                      const std::function<void(uint64_t begin, uint64_t end)>& gap);

// Zeroes the bytes of `object` (at `data`, object.size bytes) that no extent covers: the gaps the
// layout leaves between gathered tensors. A buffer about to be read into holds whatever it held
// before; the checksum must not.
void ZeroObjectGaps(const ObjectInfo& object, uint8_t* data);

// The checksum of `size` bytes at `data`. REQUIRES: for an object, its gaps are zeroed.
uint64_t ObjectChecksum(const uint8_t* data, uint64_t size);

// Called as verification goes: bytes hashed so far of `total`, and the file being read.
using VerifyProgress =
    std::function<void(uint64_t bytes_done, uint64_t bytes_total, const std::string& file)>;

// Reads every object of `model` from its files — opened one at a time with OpenModelFile, beneath
// `roots` and checked against what registration recorded when opened and when done with — and
// returns object name → checksum, as ObjectChecksum gives over the object's bytes. Memory: one
// buffer of a few MiB, whatever the model's size. `progress` (when set) is called about every 256
// MiB and once at the end. Errors: those of opening and checking the files (PERMISSION_DENIED,
// FAILED_PRECONDITION, ...), DATA_LOSS for a file shorter than recorded, I/O errors.
absl::StatusOr<std::map<std::string, uint64_t>> ChecksumModelObjects(
    const ModelInfo& model, const ModelRoots& roots, const VerifyProgress& progress = nullptr);

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_OBJECT_CHECKSUM_H_
