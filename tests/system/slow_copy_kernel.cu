#include "tests/system/slow_copy_kernel.h"

#include <cuda_runtime_api.h>

namespace tierd::testing {
namespace {

__device__ uint64_t GlobalTimerNs() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void SlowCopy(uint8_t* dst, const uint8_t* src, size_t bytes, uint64_t delay_ns) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < delay_ns) __nanosleep(100000);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

}  // namespace

std::string LaunchSlowCopy(void* cuda_stream, void* dst, const void* src, size_t bytes,
                           uint64_t delay_ns) {
  SlowCopy<<<64, 256, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes, delay_ns);
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? std::string() : cudaGetErrorString(error);
}

}  // namespace tierd::testing
