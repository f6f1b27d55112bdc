// The CUDA decoder of the exponent-codebook format (codec/exponent_format.h): one warp per tile,
// 8 tiles a block. It checks what codec::DecodeTiles checks
// — each tile's escape range against the escapes its codes use, each tile's checksum against the
// words it wrote — and reads and writes nothing outside the tables, tiles and object whatever the
// bytes say.
#ifndef TIERD_DEVICE_DETAIL_EXPONENT_DECODE_H_
#define TIERD_DEVICE_DETAIL_EXPONENT_DECODE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "codec/exponent_format.h"

namespace tierd {

// Enqueues the decoding of tiles [first_tile, first_tile + tile_count) of a compressed object —
// `tables` those tiles' tables, `tiles` their data, both device-readable — into `dst` (the
// object's raw bytes), and of the tail byte when the range ends at the last
// tile. A tile that disagrees stores 1 at `verdict` (a device-writable address: mapped host
// memory). REQUIRES: `layout` came from codec::ParseCompressedHeader; the range is within
// layout.tiles. Returns the launch's error.
cudaError_t LaunchExponentDecode(const codec::CompressedLayout& layout,
                                 const codec::TileTables& tables, const void* tiles, void* dst,
                                 uint64_t first_tile, uint64_t tile_count, uint32_t* verdict,
                                 cudaStream_t stream);

}  // namespace tierd

#endif  // TIERD_DEVICE_DETAIL_EXPONENT_DECODE_H_
