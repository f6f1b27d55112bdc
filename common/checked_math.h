// Arithmetic on sizes, counts and offsets that a client or a file chose: every product and sum is
// checked, so that a huge dimension (or a zero one beside huge ones) fails a check instead of
// wrapping a count to a small number that a loop then trusts.
#ifndef TIERD_COMMON_CHECKED_MATH_H_
#define TIERD_COMMON_CHECKED_MATH_H_

#include <cstdint>
#include <limits>
#include <optional>

namespace tierd {

// a * b, or nullopt when it does not fit in 64 bits.
inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// a + b, or nullopt when it does not fit in 64 bits.
inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

// a * b, or UINT64_MAX when that does not fit: for bounds compared against a limit.
inline uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  return CheckedMul(a, b).value_or(std::numeric_limits<uint64_t>::max());
}

// a + b, or UINT64_MAX when that does not fit.
inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return CheckedAdd(a, b).value_or(std::numeric_limits<uint64_t>::max());
}

}  // namespace tierd

#endif  // TIERD_COMMON_CHECKED_MATH_H_
