// The checksum of a model object: xxHash3 (64 bits) over its bytes in segments of
// kChecksumSegmentBytes, the alignment gaps between gathered tensors counted as zeros. An object
// of one segment or less is hashed whole; a longer one's checksum is the xxHash3 of its segments'
// xxHash3 values (8 bytes each, little-endian, in order). The segments are what lets the reader
// threads hash an object's chunks as they land, side by side (streaming_checksum.h): xxHash3 of
// the whole object is sequential, so one thread at a time could hash an object however many read
// it. The host cache computes it on every read from disk and compares it with the one the
// catalog recorded; registration with verification (`tierctl load --verify`) computes every
// object's from the files before the model is registered, so that even the first read is checked.
//
// Stateless, but for ObjectHasher; thread-safe.
#ifndef TIERD_STORAGE_MODEL_OBJECT_CHECKSUM_H_
#define TIERD_STORAGE_MODEL_OBJECT_CHECKSUM_H_

#include <xxhash.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
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

// The length of a checksum segment. Changing it changes every recorded checksum: the catalog's
// format version goes with it (storage/model/catalog_file.cc).
inline constexpr uint64_t kChecksumSegmentBytes = 4ull << 20;

// The checksum of `size` bytes at `data`. REQUIRES: for an object, its gaps are zeroed.
uint64_t ObjectChecksum(const uint8_t* data, uint64_t size);

// xxHash3 of `size` bytes at `data` taken whole: what a durable record written before checksums
// were made of segments holds (DurableRecord::whole_object_checksum).
uint64_t WholeObjectChecksum(const uint8_t* data, uint64_t size);

// The checksum of an object of `size` bytes from its segments' xxHash3 values, in order
// (ceil(size / kChecksumSegmentBytes) of them; for an object of one segment or less, that one
// value is the checksum).
uint64_t CombineSegmentChecksums(uint64_t size, absl::Span<const uint64_t> segments);

// An xxHash3 (64-bit) streaming state, freed with its pointer.
struct Xxh3StateDeleter {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};
using Xxh3State = std::unique_ptr<XXH3_state_t, Xxh3StateDeleter>;
// A new state, reset. Aborts when it cannot be allocated, as operator new would.
Xxh3State NewXxh3State();

// ObjectChecksum of bytes given in order, in pieces of any size. Not thread-safe.
class ObjectHasher {
 public:
  ObjectHasher();
  ObjectHasher(const ObjectHasher&) = delete;
  ObjectHasher& operator=(const ObjectHasher&) = delete;

  // Starts a new object.
  void Reset();
  // The object's next `size` bytes.
  void Update(const uint8_t* data, uint64_t size);
  // The checksum of the bytes given since Reset.
  uint64_t Digest() const;

 private:
  Xxh3State segment_;               // the segment being hashed
  uint64_t in_segment_ = 0;         // its bytes so far
  uint64_t size_ = 0;               // the object's bytes so far
  std::vector<uint64_t> segments_;  // the segments done
};

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
