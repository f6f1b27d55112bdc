// Element types of safetensors tensors.
#ifndef TIERD_STORAGE_DTYPE_H_
#define TIERD_STORAGE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tierd {

enum class DType {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

// The safetensors spelling ("F32", "BF16", "F8_E4M3", ...) → DType; nullopt for anything else.
std::optional<DType> ParseDType(absl::string_view name);
// The safetensors spelling of `dtype`.
const char* DTypeName(DType dtype);
// Bytes per element.
size_t DTypeSize(DType dtype);
// Bytes a tensor of `dtype` and `shape` takes (0 when a dimension is 0); nullopt when the product
// of its non-zero dimensions and the element size does not fit in 64 bits.
std::optional<uint64_t> TensorBytes(DType dtype, absl::Span<const uint64_t> shape);

}  // namespace tierd

#endif  // TIERD_STORAGE_DTYPE_H_
