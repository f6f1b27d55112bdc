// CudaDevice: the production Device on an NVIDIA GPU. Slabs are cudaMalloc'd and exported with
// cudaIpcGetMemHandle; events are cudaEventInterprocess | cudaEventDisableTiming; host memory is
// pinned with cudaHostRegister (the caller allocates it page-aligned); completions come from
// cudaLaunchHostFunc. Every CUDA error becomes an absl::Status (CudaStatus); nothing here exits.
//
// CUDA headers stay out of this header: callers see only Device.
#ifndef TIERD_DEVICE_CUDA_DEVICE_H_
#define TIERD_DEVICE_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "device/device.h"

namespace tierd {

// Number of GPUs the CUDA runtime can see; UNAVAILABLE when there is no driver or no GPU.
absl::StatusOr<int> CudaDeviceCount();

// The cudaStream_t behind `stream`, for launching kernels or library calls on it (returned as
// void* to keep CUDA headers out of this header). REQUIRES: `stream` was created by a CudaDevice.
void* NativeCudaStream(Stream& stream);

// Opens GPU `ordinal` (as numbered under CUDA_VISIBLE_DEVICES). Host waits on it block rather than
// spin (cudaDeviceScheduleBlockingSync). Errors: INVALID_ARGUMENT for an ordinal out of range,
// UNAVAILABLE when the GPU or driver cannot be used.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal);

}  // namespace tierd

#endif  // TIERD_DEVICE_CUDA_DEVICE_H_
