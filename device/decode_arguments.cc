#include "device/decode_arguments.h"

#include "absl/strings/str_cat.h"

namespace tierd {

absl::Status CheckDecodeArguments(const codec::CompressedLayout& layout,
                                  const codec::TileTables& tables, const void* tiles,
                                  const void* dst, uint64_t first_tile, uint64_t tile_count,
                                  const uint32_t* verdict) {
  if (tables.checksums == nullptr || tables.escape_starts == nullptr ||
      tables.escapes == nullptr || tiles == nullptr || dst == nullptr || verdict == nullptr) {
    return absl::InvalidArgumentError("decode with a null pointer");
  }
  if (reinterpret_cast<uintptr_t>(tables.checksums) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(tables.escape_starts) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(tiles) % 16 != 0) {
    return absl::InvalidArgumentError(
        "decode from tables not 4-byte aligned or tiles not 16-byte aligned");
  }
  if (first_tile > layout.tiles || tile_count > layout.tiles - first_tile) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode of tiles [", first_tile, ", +", tile_count, ") of ", layout.tiles));
  }
  return absl::OkStatus();
}

}  // namespace tierd
