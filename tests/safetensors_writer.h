// Writing safetensors files for tests: valid ones with known contents, and raw ones with any header
// bytes at all, for the malformed-input tests.
#ifndef TIERD_TESTS_SAFETENSORS_WRITER_H_
#define TIERD_TESTS_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

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

// Writes `contents` to `path`, replacing it.
absl::Status WriteFile(const std::string& path, const std::string& contents);

}  // namespace tierd::testing

#endif  // TIERD_TESTS_SAFETENSORS_WRITER_H_
