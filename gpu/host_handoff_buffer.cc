#include "gpu/host_handoff_buffer.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "device/pinned_host_buffer.h"

namespace tierd {
namespace {

// Page-aligned ranges: peers copy out of them with the device's DMA engines.
uint64_t Aligned(uint64_t bytes) { return RoundUp(bytes, PageSize()); }

}  // namespace

HostHandoffBuffer::HostHandoffBuffer(Device& device, uint64_t bytes)
    : device_(device), bytes_(Aligned(bytes)) {}

HostHandoffBuffer::~HostHandoffBuffer() {
  absl::MutexLock lock(&mu_);
  if (region_ == nullptr) return;
  if (absl::Status status = device_.UnregisterHostMemory(region_->data()); !status.ok()) {
    TIERD_LOG(WARNING) << "unregistering the peer handoff buffer: " << status;
  }
}

absl::StatusOr<uint64_t> HostHandoffBuffer::Allocate(uint64_t bytes) {
  const uint64_t size = Aligned(bytes);
  if (bytes == 0 || size > bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "an object of ", FormatByteSize(bytes), " does not fit the ", FormatByteSize(bytes_),
        " host buffer peers copy through: raise --peer-host-buffer-bytes"));
  }
  absl::MutexLock lock(&mu_);
  if (region_ == nullptr) {
    static std::atomic<int> next{0};
    const std::string name = absl::StrCat(SharedMemoryPrefixForPid(::getpid()), "handoff.", next++);
    ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> region, SharedMemory::Create(name, bytes_));
    RETURN_IF_ERROR(device_.RegisterHostMemory(region->data(), region->size()));
    region_ = std::move(region);
    free_.Add(0, bytes_);
    TIERD_LOG(INFO) << "peer handoff buffer: " << FormatByteSize(bytes_)
                    << " of pinned host memory";
  }
  std::optional<uint64_t> offset = free_.Take(size);
  if (!offset) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the ", FormatByteSize(bytes_), " host buffer peers copy through has no room for ",
        FormatByteSize(bytes), " (", FormatByteSize(bytes_ - free_.free_bytes()),
        " lent): retry once peers release, or raise --peer-host-buffer-bytes"));
  }
  return *offset;
}

void HostHandoffBuffer::Free(uint64_t offset, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  free_.Add(offset, Aligned(bytes));
}

uint8_t* HostHandoffBuffer::data() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint8_t*>(region_->data());
}

bool HostHandoffBuffer::allocated() const {
  absl::MutexLock lock(&mu_);
  return region_ != nullptr;
}

std::string HostHandoffBuffer::handle() const {
  absl::MutexLock lock(&mu_);
  return region_->name();
}

}  // namespace tierd
