// Fuzzes the safetensors header parser, the first thing tierd reads of an untrusted model file.
// The input is the start of a file; its claimed size is the input's own size or, chosen by the
// first byte, larger (a truncated read of a bigger file). A header the parser accepts must be
// consistent: every tensor inside the file, sorted, its bytes matching dtype and shape.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "storage/dtype.h"
#include "storage/model/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint64_t extra = data[0] < 16 ? (uint64_t{1} << (data[0] * 4)) : 0;
  const absl::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);
  const uint64_t file_size = file.size() + extra;
  absl::StatusOr<tierd::SafetensorsHeader> header =
      tierd::ParseSafetensorsHeader("fuzz.safetensors", file, file_size);
  if (!header.ok()) return 0;
  uint64_t previous_begin = 0;
  for (const tierd::SafetensorsTensor& tensor : header->tensors) {
    const std::optional<uint64_t> bytes = tierd::TensorBytes(tensor.dtype, tensor.shape);
    if (tensor.begin < header->data_start || tensor.begin < previous_begin ||
        tensor.end < tensor.begin || tensor.end > file_size || !bytes.has_value() ||
        *bytes != tensor.size()) {
      std::fprintf(stderr, "accepted an inconsistent tensor: %s\n", tensor.name.c_str());
      std::abort();
    }
    previous_begin = tensor.begin;
  }
  return 0;
}
