#include "device/pinned_host_buffer.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tierd {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

absl::StatusOr<std::unique_ptr<PinnedHostBuffer>> PinnedHostBuffer::Create(Device& device,
                                                                           size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("pinned buffer of 0 bytes");
  const size_t page = PageSize();
  const size_t rounded = (bytes + page - 1) / page * page;
  void* data = std::aligned_alloc(page, rounded);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating ", rounded, " host bytes"));
  }
  if (absl::Status status = device.RegisterHostMemory(data, rounded); !status.ok()) {
    std::free(data);
    return status;
  }
  return std::unique_ptr<PinnedHostBuffer>(new PinnedHostBuffer(device, data, rounded));
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (absl::Status status = device_.UnregisterHostMemory(data_); !status.ok()) {
    TIERD_LOG(WARNING) << "unregistering a pinned buffer: " << status;
  }
  std::free(data_);
}

}  // namespace tierd
