#include "device/detail/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace tierd {
namespace {

absl::StatusCode CodeFor(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
    case cudaErrorHostMemoryNotRegistered:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorSetOnActiveProcess:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::StatusCode::kUnavailable;
    case cudaErrorMapBufferObjectFailed:
      return absl::StatusCode::kNotFound;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::Status(CodeFor(error), absl::StrCat(what, ": ", cudaGetErrorName(error), " (",
                                                   cudaGetErrorString(error), ")"));
}

}  // namespace tierd
