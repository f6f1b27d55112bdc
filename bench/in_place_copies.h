// gpu_path_bench cold's third reference on memory-backed files: no CPU copy at all. The files are
// mapped read-only, their pages registered with the device piece by piece (cudaHostRegister with
// cudaHostRegisterReadOnly) by T threads, each piece copied to the GPU on its thread's stream as
// soon as it is registered. What it reaches bounds a daemon that would serve tmpfs pages in place
// instead of copying them into its host cache.
#ifndef TIERD_BENCH_IN_PLACE_COPIES_H_
#define TIERD_BENCH_IN_PLACE_COPIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "device/device.h"

namespace tierd::bench {

struct InPlaceTimes {
  double to_gpu_seconds = 0;      // from the first mmap to the last piece's copy done
  double register_seconds = 0;    // summed over the threads: time inside the registrations
  double unregister_seconds = 0;  // afterwards, every piece unregistered and the files unmapped
};

// Meant for files in memory (tmpfs): on a disk, the registrations would read the pages in.
//
// Copies `files`, back to back, into `gpu` (room for `gpu_bytes`, used as a ring of pieces: the
// bytes are overwritten, only the rate counts) in pieces of `piece_bytes`, on `threads` threads.
// Errors: the files' opening or mapping; UNIMPLEMENTED where the device cannot register read-only
// memory; the device's errors. REQUIRES: gpu_bytes >= piece_bytes, piece_bytes a multiple of the
// page size.
absl::StatusOr<InPlaceTimes> CopyFilesInPlace(Device& device, const std::vector<std::string>& files,
                                              uint8_t* gpu, uint64_t gpu_bytes, int threads,
                                              uint64_t piece_bytes = 64ull << 20);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_IN_PLACE_COPIES_H_
