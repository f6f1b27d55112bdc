// A deliberately slow reader of device memory, for the release-event test: a kernel that waits
// `delay_ns` (GPU time) before it copies `bytes` from `src` to `dst`, so a buffer released right
// after the launch is still being read long after the release was sent.
#ifndef TIERD_TESTS_SYSTEM_SLOW_COPY_KERNEL_H_
#define TIERD_TESTS_SYSTEM_SLOW_COPY_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tierd::testing {

// Launches the kernel on `cuda_stream` (a cudaStream_t). Returns an empty string, or the CUDA
// error's description.
std::string LaunchSlowCopy(void* cuda_stream, void* dst, const void* src, size_t bytes,
                           uint64_t delay_ns);

}  // namespace tierd::testing

#endif  // TIERD_TESTS_SYSTEM_SLOW_COPY_KERNEL_H_
