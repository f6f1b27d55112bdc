// cudaError_t → absl::Status, in exactly one place: the CUDA backend's.
#ifndef TIERD_DEVICE_DETAIL_CUDA_STATUS_H_
#define TIERD_DEVICE_DETAIL_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tierd {

// OK for cudaSuccess. Otherwise clears the runtime's last-error slot (so one failure is not
// reported again by an unrelated later call) and returns a status whose code says what the caller
// should do: RESOURCE_EXHAUSTED for allocation failures, INVALID_ARGUMENT for bad values or
// handles, UNAVAILABLE when no usable GPU or driver is there, FAILED_PRECONDITION for registration
// state, INTERNAL otherwise. The message names `what` and the CUDA error.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

}  // namespace tierd

#endif  // TIERD_DEVICE_DETAIL_CUDA_STATUS_H_
