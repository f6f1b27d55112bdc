// The checks both backends make of a Device::DecodeAsync call before they enqueue it.
#ifndef TIERD_DEVICE_DECODE_ARGUMENTS_H_
#define TIERD_DEVICE_DECODE_ARGUMENTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "codec/exponent_format.h"

namespace tierd {

// INVALID_ARGUMENT for tiles past the object's end, a null pointer, checksums or escape starts not
// 4-byte aligned or tiles not 16-byte aligned (the decoder reads them with aligned loads); OK
// otherwise.
absl::Status CheckDecodeArguments(const codec::CompressedLayout& layout,
                                  const codec::TileTables& tables,
                                  const void* tiles, const void* dst, uint64_t first_tile,
                                  uint64_t tile_count, const uint32_t* verdict);

}  // namespace tierd

#endif  // TIERD_DEVICE_DECODE_ARGUMENTS_H_
