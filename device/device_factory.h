// Choosing and creating the Device from a `--device=auto|host|cuda:N` spec.
#ifndef TIERD_DEVICE_DEVICE_FACTORY_H_
#define TIERD_DEVICE_DEVICE_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "device/device.h"

namespace tierd {

struct DeviceSpec {
  enum class Kind { kAuto, kHost, kCuda };
  Kind kind = Kind::kAuto;
  int ordinal = 0;  // for kCuda

  std::string ToString() const;
};

// Parses "auto", "host" or "cuda:N". Errors: INVALID_ARGUMENT naming the bad spec.
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text);

// True when this build contains the CUDA backend.
bool CudaBackendBuiltIn();

// Creates the device `spec` names. "auto" picks cuda:0 when a GPU is visible and host otherwise,
// and logs which and why. Errors: FAILED_PRECONDITION for cuda:N in a build without CUDA; the
// backend's errors otherwise.
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceSpec& spec);

}  // namespace tierd

#endif  // TIERD_DEVICE_DEVICE_FACTORY_H_
