#include "tests/storage_test_support.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <fstream>
#include <iterator>

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

std::string TensorSplit(const TensorSpec& tensor, size_t dim, uint64_t index, uint64_t count) {
  const std::vector<uint64_t>& shape = tensor.shape;
  uint64_t elements = 1;
  for (uint64_t size : shape) elements *= size;
  const size_t element = elements == 0 ? 1 : tensor.data.size() / elements;
  std::vector<uint64_t> sizes(count, shape[dim] / count);
  for (uint64_t i = 0; i < shape[dim] % count; ++i) ++sizes[i];
  uint64_t first = 0;
  for (uint64_t i = 0; i < index; ++i) first += sizes[i];
  uint64_t after = 1;  // elements per step along `dim`
  for (size_t d = dim + 1; d < shape.size(); ++d) after *= shape[d];
  std::string out;
  for (uint64_t i = 0; i < elements; ++i) {
    const uint64_t coordinate = (i / after) % shape[dim];
    if (coordinate >= first && coordinate < first + sizes[index]) {
      out.append(tensor.data, i * element, element);
    }
  }
  return out;
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

absl::Status FlipByteKeepingMtime(const std::string& path, uint64_t offset, uint8_t mask) {
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0) return absl::NotFoundError(path);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(offset));
    const int byte = file.get();
    if (byte == EOF) return absl::OutOfRangeError(absl::StrCat(path, " has no byte ", offset));
    file.seekp(static_cast<std::streamoff>(offset));
    file.put(static_cast<char>(byte ^ mask));
    file.close();
    if (!file) return absl::InternalError(absl::StrCat("writing ", path));
  }
  const timespec times[2] = {{0, UTIME_OMIT}, before.st_mtim};
  if (::utimensat(AT_FDCWD, path.c_str(), times, 0) != 0) {
    return absl::InternalError(absl::StrCat("putting back the mtime of ", path));
  }
  return absl::OkStatus();
}

}  // namespace tierd::testing
