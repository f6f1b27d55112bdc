// Writing safetensors files: a model on disk with known contents, for the tests, the fuzzers and
// tools that need one. The daemon itself only reads them (safetensors_header.h).
//
// Stateless; thread-safe.
#ifndef TIERD_TESTING_SAFETENSORS_WRITER_H_
#define TIERD_TESTING_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tierd {

struct TensorToWrite {
  std::string name;
  std::string dtype = "F32";  // as safetensors spells it
  std::vector<uint64_t> shape;
  std::string data;  // exactly product(shape) × dtype size bytes
};

// The header JSON WriteSafetensors writes for `tensors` (their data back to back, in order) and
// `metadata` (the "__metadata__" entry, left out when empty).
std::string SafetensorsHeaderJson(const std::vector<TensorToWrite>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// Writes a valid safetensors file at `path`, replacing it: the tensors' data back to back in the
// order given. Errors: the file system's.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes the 8-byte little-endian length (`declared_length`, or header.size() when absent),
// `header`, then `data`, at `path`: anything at all, for malformed-file tests.
absl::Status WriteRawSafetensors(const std::string& path, const std::string& header,
                                 const std::string& data,
                                 std::optional<uint64_t> declared_length = std::nullopt);

}  // namespace tierd

#endif  // TIERD_TESTING_SAFETENSORS_WRITER_H_
