// Helpers for the storage tests: writing safetensors files (valid ones with known contents, and raw
// ones with any header bytes at all, for the malformed-input tests) and disk reader options.
#ifndef TIERD_TESTS_STORAGE_TEST_SUPPORT_H_
#define TIERD_TESTS_STORAGE_TEST_SUPPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "storage/disk_reader.h"

namespace tierd::testing {

struct TensorSpec {
  std::string name;
  std::string dtype = "F32";
  std::vector<uint64_t> shape;
  std::string data;  // exactly product(shape) × dtype size bytes
};

// A tensor of `dtype` and `shape` filled with FillPattern(seed).
TensorSpec RandomTensor(const std::string& name, const std::string& dtype,
                        const std::vector<uint64_t>& shape, uint64_t seed);

// Writes a valid safetensors file: the tensors' data back to back in the order given.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes 8-byte little-endian length (`declared_length`, or header.size() when absent), `header`,
// then `data`: anything at all, for malformed-file tests.
absl::Status WriteRawSafetensors(const std::string& path, const std::string& header,
                                 const std::string& data,
                                 std::optional<uint64_t> declared_length = std::nullopt);

// The header JSON WriteSafetensors would write for `tensors`.
std::string SafetensorsHeaderJson(const std::vector<TensorSpec>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// Reader options with the given threads, queue depth and chunk size, the rest default.
DiskReaderOptions ReaderOptions(int threads, int queue_depth, uint64_t chunk_bytes);

// Writes `contents` to `path`, replacing it.
absl::Status WriteFile(const std::string& path, const std::string& contents);
// The bytes of the file at `path`; empty when it cannot be read.
std::string ReadWholeFile(const std::string& path);

}  // namespace tierd::testing

#endif  // TIERD_TESTS_STORAGE_TEST_SUPPORT_H_
