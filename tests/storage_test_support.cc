#include "tests/storage_test_support.h"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "storage/dtype.h"
#include "tests/test_support.h"

namespace tierd::testing {

TensorSpec RandomTensor(const std::string& name, const std::string& dtype,
                        const std::vector<uint64_t>& shape, uint64_t seed) {
  uint64_t elements = 1;
  for (uint64_t dim : shape) elements *= dim;
  const std::optional<DType> parsed = ParseDType(dtype);
  const size_t bytes = elements * (parsed.has_value() ? DTypeSize(*parsed) : 1);
  TensorSpec spec{name, dtype, shape, std::string(bytes, '\0')};
  FillPattern(spec.data.data(), bytes, seed);
  return spec;
}

std::string SafetensorsHeaderJson(const std::vector<TensorSpec>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.data.size()}}};
    offset += tensor.data.size();
  }
  return header.dump();
}

DiskReaderOptions ReaderOptions(int threads, int queue_depth, uint64_t chunk_bytes) {
  DiskReaderOptions options;
  options.threads = threads;
  options.queue_depth = queue_depth;
  options.chunk_bytes = chunk_bytes;
  return options;
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("writing ", path));
  return absl::OkStatus();
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::Status WriteRawSafetensors(const std::string& path, const std::string& header,
                                 const std::string& data, std::optional<uint64_t> declared_length) {
  const uint64_t length = declared_length.value_or(header.size());
  std::string contents(8, '\0');
  for (int i = 0; i < 8; ++i) contents[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  contents += header;
  contents += data;
  return WriteFile(path, contents);
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::string data;
  for (const TensorSpec& tensor : tensors) data += tensor.data;
  return WriteRawSafetensors(path, SafetensorsHeaderJson(tensors, metadata), data);
}

}  // namespace tierd::testing
