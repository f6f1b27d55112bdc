// Weights with the statistics of a freshly initialised checkpoint, for tests and benchmarks of the
// codec: normal values of a given standard deviation (transformers initialises linear layers with
// N(0, 0.02)), rounded to bf16 or fp16 as a checkpoint stores them, or quantised to FP8 with
// per-block scales as FP8 checkpoints are. Deterministic for a seed.
#ifndef TIERD_TESTING_SAMPLE_WEIGHTS_H_
#define TIERD_TESTING_SAMPLE_WEIGHTS_H_

#include <cstdint>

#include "codec/exponent_format.h"

namespace tierd::codec {

// Writes `words` 16-bit floats of N(0, stddev²) in `layout`'s format to `out`.
void FillNormalWeights(WordLayout layout, double stddev, uint64_t seed, uint16_t* out,
                       uint64_t words);

// Round-to-nearest-even conversions of a float.
uint16_t FloatToBf16(float value);
uint16_t FloatToFp16(float value);

// The two FP8 formats of OCP's 8-bit floating point specification, as torch's float8_e4m3fn and
// float8_e5m2 store them.
enum class Fp8Format {
  kE4m3,  // bias 7, no infinities, largest finite 448
  kE5m2,  // bias 15, largest finite 57344
};

// Round-to-nearest-even conversion of a float to FP8, saturating: a finite value beyond the
// format's largest becomes the largest (as a quantiser clamps), NaN stays NaN.
uint8_t FloatToFp8(Fp8Format format, float value);
float Fp8ToFloat(Fp8Format format, uint8_t value);
float Fp8Max(Fp8Format format);

// A rows × cols matrix of N(0, stddev²) values (row-major, from `seed`) quantised as DeepSeek-V3's
// and Qwen3's FP8 checkpoints are: per block of block × block values, scale = amax / Fp8Max and
// each value stored as FloatToFp8(value / scale). Writes rows * cols bytes to `out` and the scales
// (the checkpoint's weight_scale_inv, row-major over the blocks, ceil(rows / block) ×
// ceil(cols / block) floats) to `scales`.
void FillBlockScaledFp8Weights(Fp8Format format, double stddev, uint64_t seed, uint64_t rows,
                               uint64_t cols, uint64_t block, uint8_t* out, float* scales);

}  // namespace tierd::codec

#endif  // TIERD_TESTING_SAMPLE_WEIGHTS_H_
