#include "testing/sample_weights.h"

#include <cstring>
#include <random>

namespace tierd::codec {

uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t FloatToFp16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = bits & 0x7fffff;
  if (((bits >> 23) & 0xff) == 0xff) return sign | 0x7c00 | (mantissa != 0 ? 0x200 : 0);
  if (exponent >= 31) return sign | 0x7c00;
  if (exponent <= 0) {
    if (exponent < -10) return sign;
    mantissa |= 0x800000;
    const uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t remainder = mantissa & 0x1fff;
  if (remainder > 0x1000 || (remainder == 0x1000 && (half & 1))) ++half;  // may carry to inf
  return static_cast<uint16_t>(sign | half);
}

void FillNormalWeights(WordLayout layout, double stddev, uint64_t seed, uint16_t* out,
                       uint64_t words) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
  for (uint64_t i = 0; i < words; ++i) {
    const float value = normal(engine);
    out[i] = layout == WordLayout::kFp16 ? FloatToFp16(value) : FloatToBf16(value);
  }
}

}  // namespace tierd::codec
