// The model disk_read_bench --mode=host-load loads: safetensors files of random bytes, laid out as
// a checkpoint is (shards of a few GiB, one tensor per block, so that block grouping makes one
// object of each), written when the directory does not hold it yet, and the check that a load
// brought every object's bytes in as the files hold them.
//
// Benchmarks die on any error (bench_support.h); so do these functions.
#ifndef TIERD_BENCH_HOST_LOAD_MODEL_H_
#define TIERD_BENCH_HOST_LOAD_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tierd::bench {

// One object: tensor "<name>.weight" of U8, alone in block <name>.
struct HostLoadObject {
  std::string name;     // "model.layers.N", the object's name under block grouping
  size_t file = 0;      // index into HostLoadModel::files
  uint64_t offset = 0;  // of its bytes in that file
  uint64_t bytes = 0;
};

struct HostLoadFile {
  std::string path;
  std::string header;  // the safetensors header JSON, padded to 8 bytes
  uint64_t bytes = 0;  // the whole file: length prefix, header and data
};

struct HostLoadModel {
  std::string directory;
  std::vector<HostLoadFile> files;
  std::vector<HostLoadObject> objects;
  uint64_t object_bytes = 0;  // the sum of the objects' sizes
  uint64_t file_bytes = 0;    // the sum of the files' sizes
};

// The layout of a model of `model_bytes` in objects of `object_bytes` (the last one smaller when
// they do not divide), as many as fit whole in `shard_bytes` going to each file (at least one).
// REQUIRES: all three are positive.
HostLoadModel PlanHostLoadModel(const std::string& directory, uint64_t model_bytes,
                                uint64_t object_bytes, uint64_t shard_bytes);

// Writes `model` in its directory (created when missing) unless a stamp file there says it was
// written with this layout already. Dies when the directory holds .safetensors files but no stamp:
// a model this benchmark did not write is never overwritten.
void EnsureHostLoadModel(const HostLoadModel& model);

// Compares every object's bytes at `bytes_of(object index)` with its bytes in the files, on up to
// `threads` threads; dies naming the first object and offset that differ. Returns the objects
// checked. REQUIRES: bytes_of is thread-safe and each pointer has the object's size.
size_t VerifyHostLoadObjects(const HostLoadModel& model,
                             const std::function<const uint8_t*(size_t)>& bytes_of, int threads);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_HOST_LOAD_MODEL_H_
