// Reads of files whose pages are memory — tmpfs (/dev/shm model stores), ramfs. There is no device
// to keep busy: a read is the kernel copying pages, on the thread that asks, so the disk reader's
// thread reads such a file itself, synchronously, straight into the destination (no bounce buffer,
// no alignment: O_DIRECT brings nothing there). It reads in pieces small enough to stay in the
// core's cache and tells each piece as it lands, so that the caller hashes it while it is there
// (ReadRequest::landed): hashed after a whole 4 MiB chunk, the bytes come back from memory and the
// load runs at about 0.68 of the bare reads' rate on 16 cores, against 0.80 in pieces of 256 KiB
// (bench/checksum_bench --source-file on tmpfs, docs/BENCHMARKS.md).
//
// Internal to storage/io. Stateless; thread-safe.
#ifndef TIERD_STORAGE_IO_DETAIL_MEMORY_READ_H_
#define TIERD_STORAGE_IO_DETAIL_MEMORY_READ_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace tierd {

// The pieces a memory-backed file is read in.
inline constexpr uint64_t kMemoryReadPieceBytes = 256ull << 10;

// Whether a file system of type `f_type` (statfs) keeps its files' pages in memory: tmpfs, ramfs.
bool IsMemoryFileSystem(long f_type);
// Whether the file open at `fd` keeps its pages in memory. False when it cannot be told.
bool IsMemoryBacked(int fd);

// Reads `length` bytes of `fd` from `offset` into `destination`, in pieces of at most
// kMemoryReadPieceBytes, calling `landed(piece, bytes)` after each. Returns the bytes read: fewer
// than `length` when the file ends first. A read the kernel fails is its errno (PosixError); what
// landed before it was told.
absl::StatusOr<uint64_t> ReadInPieces(
    int fd, uint64_t offset, uint64_t length, uint8_t* destination,
    absl::FunctionRef<void(const uint8_t* piece, uint64_t bytes)> landed);

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_DETAIL_MEMORY_READ_H_
