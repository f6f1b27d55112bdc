// The models benchmarks write: safetensors files of U8 tensors filled with pseudo-random bytes, of
// bf16 tensors with the statistics of a freshly initialised checkpoint, or of those weights
// quantised to e4m3 as FP8 checkpoints are, of the sizes a `--tensors` list names
// ("16MiBx64,700MiBx2": 64 tensors of 16 MiB, 2 of 700 MiB).
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

enum class WeightValues {
  kRandomBytes,  // U8 tensors of pseudo-random bytes: nothing for a codec to gain
  kNormalBf16,   // BF16 tensors of N(0, 0.02²), as transformers initialises linear layers
  // F8_E4M3 tensors of N(0, 0.02²) weights quantised per block of 128 × 128 with a scale of
  // amax / 448, as DeepSeek-V3's and Qwen3's FP8 checkpoints are (the scales are not written).
  kE4m3,
};

// Parses --weights: "random", "normal" or "e4m3". Dies on anything else.
WeightValues ParseWeightValues(const std::string& text);

// Writes `tensors` into `dir` (created when missing) as `files` safetensors files, the tensors
// dealt round-robin over them, named model-I-of-N.safetensors. With `row_bytes`, a tensor whose
// size it divides is 2-D, [size / row_bytes, row_bytes] of bytes (tensor-parallel shards split it
// along either dimension); otherwise 1-D. The bytes depend only on the list, the file count and
// `values`. Dies on a write error, or on a size that is not whole words of `values`.
void WriteModel(const std::string& dir, const std::vector<TensorSpec>& tensors, int files,
                uint64_t row_bytes = 0, WeightValues values = WeightValues::kRandomBytes);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_MODEL_WRITER_H_
