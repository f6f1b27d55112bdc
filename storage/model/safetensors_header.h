// Parsing safetensors headers, which are untrusted input.
//
// A safetensors file is: 8 bytes little-endian N, N bytes of JSON, then the data. The JSON maps
// tensor names to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} (offsets relative
// to the start of the data) and may hold "__metadata__": {string: string}.
//
// The parser never trusts the file: the header length is bounded, JSON nesting is bounded before
// parsing, every integer is checked for 64-bit overflow, offsets must lie inside the file, tensors
// may not overlap, dtypes must be known, and shape × dtype size must equal the byte length. Errors
// name the file and, where there is one, the tensor:
//   - DATA_LOSS: the file is shorter than its header says (truncated);
//   - INVALID_ARGUMENT: anything else malformed.
// Never a crash, for any input.
#ifndef TIERD_STORAGE_MODEL_SAFETENSORS_HEADER_H_
#define TIERD_STORAGE_MODEL_SAFETENSORS_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/dtype.h"

namespace tierd {

// Headers larger than this are refused (safetensors' own reader uses the same bound).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // absolute byte offset of the first byte in the file
  uint64_t end = 0;    // absolute byte offset one past the last byte

  uint64_t size() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                 // 8 + header length
  std::vector<SafetensorsTensor> tensors;  // sorted by begin (then name)
  std::map<std::string, std::string> metadata;
};

// Parses a header from `file_start`, the first bytes of a file of `file_size` bytes.
// `file_start` must hold at least min(file_size, 8 + header length) bytes — ReadSafetensorsHeader
// reads exactly that — except where the length prefix is itself refused (over the bound, or past
// the end of the file): those errors need only the first 8 bytes. `file_label` names the file in
// error messages. Gaps between tensors are allowed. A header with more than `max_tensors` tensors
// is refused (INVALID_ARGUMENT, IsTensorLimit) as soon as the parser meets the one too many.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view file_label, absl::string_view file_start, uint64_t file_size,
    size_t max_tensors = std::numeric_limits<size_t>::max());

// Whether `status` is the refusal of a header with more than the `max_tensors` it was parsed with.
bool IsTensorLimit(const absl::Status& status);

// Reads and parses the header of the file at `path`. Errors: those of ParseSafetensorsHeader, and
// NOT_FOUND / PERMISSION_DENIED / ... from opening or reading the file.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);
// The same from the open file `fd`, named `path` in errors.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    int fd, const std::string& path, size_t max_tensors = std::numeric_limits<size_t>::max());

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_SAFETENSORS_HEADER_H_
