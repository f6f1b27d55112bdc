#include "testing/sample_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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

namespace {

struct Fp8Shape {
  int mantissa_bits;
  int bias;
  uint8_t largest;  // the code of the largest finite value, sign clear
  uint8_t nan;
};

Fp8Shape ShapeOf(Fp8Format format) {
  return format == Fp8Format::kE4m3 ? Fp8Shape{3, 7, 0x7e, 0x7f} : Fp8Shape{2, 15, 0x7b, 0x7f};
}

}  // namespace

float Fp8ToFloat(Fp8Format format, uint8_t value) {
  const Fp8Shape shape = ShapeOf(format);
  const float sign = (value & 0x80) ? -1.0f : 1.0f;
  const int fields = value & 0x7f;
  if (fields == shape.nan || (format == Fp8Format::kE5m2 && fields > 0x7c)) return std::nanf("");
  if (format == Fp8Format::kE5m2 && fields == 0x7c) return sign * INFINITY;
  const int exponent = fields >> shape.mantissa_bits;
  const int mantissa = fields & ((1 << shape.mantissa_bits) - 1);
  if (exponent == 0) {
    return sign * std::ldexp(static_cast<float>(mantissa), 1 - shape.bias - shape.mantissa_bits);
  }
  return sign * std::ldexp(static_cast<float>(mantissa + (1 << shape.mantissa_bits)),
                           exponent - shape.bias - shape.mantissa_bits);
}

float Fp8Max(Fp8Format format) { return Fp8ToFloat(format, ShapeOf(format).largest); }

uint8_t FloatToFp8(Fp8Format format, float value) {
  const Fp8Shape shape = ShapeOf(format);
  if (std::isnan(value)) return shape.nan;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const float magnitude = std::fabs(value);
  if (magnitude >= Fp8Max(format)) return sign | shape.largest;
  // The spacing of representable values at this magnitude: the subnormals' below the smallest
  // normal. Scaling by a power of two is exact, and nearbyint rounds half to even.
  const int min_exponent = 1 - shape.bias;
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent-1), 2^exponent)
  const int step = std::max(exponent - 1, min_exponent) - shape.mantissa_bits;
  const float units = std::nearbyint(std::ldexp(magnitude, -step));
  const float rounded = std::ldexp(units, step);
  if (rounded >= Fp8Max(format)) return sign | shape.largest;
  if (rounded < std::ldexp(1.0f, min_exponent)) {  // a subnormal, or zero
    return sign | static_cast<uint8_t>(std::ldexp(rounded, shape.mantissa_bits - min_exponent));
  }
  std::frexp(rounded, &exponent);  // rounding may have carried into the next binade
  const int field = exponent - 1 + shape.bias;
  const int mantissa =
      static_cast<int>(std::ldexp(rounded, shape.mantissa_bits - (exponent - 1))) -
      (1 << shape.mantissa_bits);
  return sign | static_cast<uint8_t>((field << shape.mantissa_bits) | mantissa);
}

void FillBlockScaledFp8Weights(Fp8Format format, double stddev, uint64_t seed, uint64_t rows,
                               uint64_t cols, uint64_t block, uint8_t* out, float* scales) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(stddev));
  std::vector<float> values(rows * cols);
  for (float& value : values) value = normal(engine);
  const uint64_t block_cols = (cols + block - 1) / block;
  for (uint64_t r0 = 0; r0 < rows; r0 += block) {
    for (uint64_t c0 = 0; c0 < cols; c0 += block) {
      const uint64_t r1 = std::min(rows, r0 + block);
      const uint64_t c1 = std::min(cols, c0 + block);
      float amax = 0;
      for (uint64_t r = r0; r < r1; ++r) {
        for (uint64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(values[r * cols + c]));
      }
      const float scale = amax > 0 ? amax / Fp8Max(format) : 1.0f;
      scales[(r0 / block) * block_cols + c0 / block] = scale;
      for (uint64_t r = r0; r < r1; ++r) {
        for (uint64_t c = c0; c < c1; ++c) {
          out[r * cols + c] = FloatToFp8(format, values[r * cols + c] / scale);
        }
      }
    }
  }
}

}  // namespace tierd::codec
