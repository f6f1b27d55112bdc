#include "bench/gpu_path_session.h"

#include <cstring>

namespace tierd::bench {

nlohmann::json Environment(Bench& bench) {
  return {{"date", tierd::bench::TodayUtc()},
          {"device", bench.session().info().device()},
          {"model", bench.model()}};
}

double PlainCopies(tierd::Device& device, tierd::Stream& stream, uint8_t* dst, const uint8_t* src,
                   uint64_t buffer_bytes, const std::vector<uint64_t>& sizes) {
  const Clock::time_point start = Clock::now();
  uint64_t at = 0;
  for (uint64_t size : sizes) {
    if (at + size > buffer_bytes) at = 0;
    Check(device.CopyAsync(stream, dst + at, src + at, size), "cudaMemcpyAsync");
    at += size;
  }
  Check(device.SynchronizeStream(stream), "synchronizing");
  return SecondsSince(start);
}

Buffers AllocateBuffers(tierd::Device& device, uint64_t bytes) {
  Buffers buffers;
  buffers.host = Check(tierd::PinnedHostBuffer::Create(device, bytes), "pinned host buffer");
  std::memset(buffers.host->data(), 0x5a, bytes);
  buffers.gpu = Check(device.AllocateSlab(bytes), "GPU buffer");
  return buffers;
}

}  // namespace tierd::bench
