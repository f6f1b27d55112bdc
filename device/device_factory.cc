#include "device/device_factory.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "device/host_device.h"
#ifdef TIERD_HAVE_CUDA
#include "device/cuda_device.h"
#endif

namespace tierd {

std::string DeviceSpec::ToString() const {
  switch (kind) {
    case Kind::kAuto:
      return "auto";
    case Kind::kHost:
      return "host";
    case Kind::kCuda:
      return absl::StrCat("cuda:", ordinal);
  }
  return "?";
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text) {
  DeviceSpec spec;
  absl::string_view ordinal = text;
  if (text == "auto") {
    spec.kind = DeviceSpec::Kind::kAuto;
  } else if (text == "host") {
    spec.kind = DeviceSpec::Kind::kHost;
  } else if (absl::ConsumePrefix(&ordinal, "cuda:") && absl::SimpleAtoi(ordinal, &spec.ordinal) &&
             spec.ordinal >= 0) {
    spec.kind = DeviceSpec::Kind::kCuda;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("bad device '", text, "': expected auto, host or cuda:N"));
  }
  return spec;
}

bool CudaBackendBuiltIn() {
#ifdef TIERD_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceSpec& spec) {
  switch (spec.kind) {
    case DeviceSpec::Kind::kHost: {
      auto device = HostDevice::Create();
      if (!device.ok()) return device.status();
      return std::unique_ptr<Device>(*std::move(device));
    }
    case DeviceSpec::Kind::kCuda:
#ifdef TIERD_HAVE_CUDA
      return CreateCudaDevice(spec.ordinal);
#else
      return absl::FailedPreconditionError(
          absl::StrCat("--device=", spec.ToString(), ": this build has no CUDA backend"));
#endif
    case DeviceSpec::Kind::kAuto: {
#ifdef TIERD_HAVE_CUDA
      absl::StatusOr<int> count = CudaDeviceCount();
      if (count.ok()) {
        TIERD_LOG(INFO) << "--device=auto: " << *count << " GPU(s) visible, using cuda:0";
        return CreateCudaDevice(0);
      }
      TIERD_LOG(INFO) << "--device=auto: no usable GPU (" << count.status().message()
                      << "), using the host backend";
#else
      TIERD_LOG(INFO) << "--device=auto: built without CUDA, using the host backend";
#endif
      return CreateDevice(DeviceSpec{DeviceSpec::Kind::kHost, 0});
    }
  }
  return absl::InternalError("unknown device kind");
}

}  // namespace tierd
