// Helpers for the storage tests: tensors with known contents, safetensors files (valid ones, and
// raw ones with any header bytes at all, for the malformed-input tests;
// testing/safetensors_writer.h) and disk reader options.
#ifndef TIERD_TESTS_STORAGE_TEST_SUPPORT_H_
#define TIERD_TESTS_STORAGE_TEST_SUPPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "storage/io/disk_reader.h"
#include "testing/safetensors_writer.h"

namespace tierd::testing {

using TensorSpec = ::tierd::TensorToWrite;
using ::tierd::SafetensorsHeaderJson;
using ::tierd::WriteRawSafetensors;
using ::tierd::WriteSafetensors;

// A tensor of `dtype` and `shape` filled with FillPattern(seed).
TensorSpec RandomTensor(const std::string& name, const std::string& dtype,
                        const std::vector<uint64_t>& shape, uint64_t seed);

// torch.tensor_split(tensor, count, dim)[index] of `tensor`, computed element by element from the
// documented rule (of n rows, the first n % count parts get one row more): the reference shards
// are checked against.
std::string TensorSplit(const TensorSpec& tensor, size_t dim, uint64_t index, uint64_t count);

// Reader options with the given threads, queue depth and chunk size, the rest default.
DiskReaderOptions ReaderOptions(int threads, int queue_depth, uint64_t chunk_bytes);

// Writes `contents` to `path`, replacing it.
absl::Status WriteFile(const std::string& path, const std::string& contents);
// The bytes of the file at `path`; empty when it cannot be read.
std::string ReadWholeFile(const std::string& path);
// Flips bits `mask` of the byte at `offset` of the file at `path` and puts its mtime back: the
// bytes change, not what the file's metadata says, as with a failing disk or a careful attacker.
absl::Status FlipByteKeepingMtime(const std::string& path, uint64_t offset, uint8_t mask = 0x40);

}  // namespace tierd::testing

#endif  // TIERD_TESTS_STORAGE_TEST_SUPPORT_H_
