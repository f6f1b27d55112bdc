#include "testing/safetensors_writer.h"

#include <fcntl.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/fd_io.h"
#include "common/posix_error.h"
#include "common/status_macros.h"

namespace tierd {

std::string SafetensorsHeaderJson(const std::vector<TensorToWrite>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.data.size()}}};
    offset += tensor.data.size();
  }
  return header.dump();
}

absl::Status WriteRawSafetensors(const std::string& path, const std::string& header,
                                 const std::string& data, std::optional<uint64_t> declared_length) {
  const uint64_t length = declared_length.value_or(header.size());
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return PosixError(absl::StrCat("creating ", path), errno);
  RETURN_IF_ERROR(WriteAll(fd.get(), prefix, path));
  RETURN_IF_ERROR(WriteAll(fd.get(), header, path));
  RETURN_IF_ERROR(WriteAll(fd.get(), data, path));
  return fd.Close(path);
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::string data;
  for (const TensorToWrite& tensor : tensors) data += tensor.data;
  return WriteRawSafetensors(path, SafetensorsHeaderJson(tensors, metadata), data);
}

}  // namespace tierd
