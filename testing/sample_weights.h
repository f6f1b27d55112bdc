// Weights with the statistics of a freshly initialised checkpoint, for tests and benchmarks of the
// codec: normal values of a given standard deviation (transformers initialises linear layers with
// N(0, 0.02)), rounded to bf16 or fp16 as a checkpoint stores them. Deterministic for a seed.
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

}  // namespace tierd::codec

#endif  // TIERD_TESTING_SAMPLE_WEIGHTS_H_
