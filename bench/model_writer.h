// The models benchmarks write: safetensors files of U8 tensors filled with pseudo-random bytes, of
// the sizes a `--tensors` list names ("16MiBx64,700MiBx2": 64 tensors of 16 MiB, 2 of 700 MiB).
#ifndef TIERD_BENCH_MODEL_WRITER_H_
#define TIERD_BENCH_MODEL_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tierd::bench {

struct TensorSpec {
  std::string name;
  uint64_t bytes;
};

// The tensors of a `SIZExCOUNT,...` list, named by size and index. Dies on a malformed list or one
// that names no tensor.
std::vector<TensorSpec> ParseTensorList(const std::string& text);

// Writes `tensors` into `dir` (created when missing) as `files` safetensors files, the tensors
// dealt round-robin over them, named model-I-of-N.safetensors. With `row_bytes`, a tensor whose
// size it divides is 2-D, [size / row_bytes, row_bytes] (tensor-parallel shards split it along
// either dimension); otherwise 1-D. The bytes depend only on the list and the file count. Dies on
// a write error.
void WriteModel(const std::string& dir, const std::vector<TensorSpec>& tensors, int files,
                uint64_t row_bytes = 0);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_MODEL_WRITER_H_
