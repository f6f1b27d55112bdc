#include "storage/dtype.h"

namespace tierd {
namespace {

struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kBool, "BOOL", 1},      {DType::kU8, "U8", 1},          {DType::kI8, "I8", 1},
    {DType::kF8E5M2, "F8_E5M2", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},        {DType::kF16, "F16", 2},        {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},        {DType::kU32, "U32", 4},        {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},        {DType::kI64, "I64", 8},        {DType::kU64, "U64", 8},
};

const DTypeEntry& EntryOf(DType dtype) {
  for (const DTypeEntry& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

}  // namespace

std::optional<DType> ParseDType(absl::string_view name) {
  for (const DTypeEntry& entry : kDTypes) {
    if (name == entry.name) return entry.dtype;
  }
  return std::nullopt;
}

const char* DTypeName(DType dtype) { return EntryOf(dtype).name; }

size_t DTypeSize(DType dtype) { return EntryOf(dtype).size; }

std::optional<uint64_t> TensorBytes(DType dtype, absl::Span<const uint64_t> shape) {
  // The non-zero dimensions' product is checked even when a dimension is 0: strides are products
  // of dimensions, and must fit whatever the tensor's size.
  uint64_t bytes = DTypeSize(dtype);
  bool empty = false;
  for (const uint64_t dim : shape) {
    if (dim == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return std::nullopt;
    }
  }
  return empty ? 0 : bytes;
}

}  // namespace tierd
