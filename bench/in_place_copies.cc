#include "bench/in_place_copies.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_support.h"

namespace tierd::bench {
namespace {

struct Mapping {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

struct Piece {
  const uint8_t* data;
  uint64_t size;
};

}  // namespace

absl::StatusOr<InPlaceTimes> CopyFilesInPlace(Device& device, const std::vector<std::string>& files,
                                              uint8_t* gpu, uint64_t gpu_bytes, int threads,
                                              uint64_t piece_bytes) {
  threads = std::max(threads, 1);
  const uint64_t slots = gpu_bytes / piece_bytes;
  if (slots == 0) return absl::InvalidArgumentError("the GPU buffer is smaller than one piece");
  std::vector<std::unique_ptr<Stream>> streams;
  for (int t = 0; t < threads; ++t) {
    absl::StatusOr<std::unique_ptr<Stream>> stream = device.CreateStream(StreamPriority::kNormal);
    if (!stream.ok()) return stream.status();
    streams.push_back(*std::move(stream));
  }

  InPlaceTimes times;
  std::vector<Mapping> mappings;
  auto unmap_all = [&] {
    for (const Mapping& mapping : mappings) {
      ::munmap(const_cast<uint8_t*>(mapping.data), mapping.size);
    }
  };
  const Clock::time_point start = Clock::now();
  std::vector<Piece> pieces;
  for (const std::string& path : files) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      unmap_all();
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
    }
    struct stat st;
    void* data = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    }
    const int error = errno;
    ::close(fd);
    if (data == MAP_FAILED) {
      unmap_all();
      return absl::ErrnoToStatus(error, absl::StrCat("cannot map ", path));
    }
    mappings.push_back({static_cast<const uint8_t*>(data), static_cast<uint64_t>(st.st_size)});
    for (uint64_t at = 0; at < mappings.back().size; at += piece_bytes) {
      pieces.push_back({mappings.back().data + at,
                        std::min(piece_bytes, mappings.back().size - at)});
    }
  }

  std::atomic<size_t> next{0};
  std::vector<char> registered(pieces.size(), 0);  // not vector<bool>: written by threads at once
  absl::Mutex mu;
  absl::Status first_error;
  double register_seconds = 0;
  auto copy_pieces = [&](int t) {
    double registering = 0;
    absl::Status status;
    for (size_t i = next++; i < pieces.size() && status.ok(); i = next++) {
      const Clock::time_point before = Clock::now();
      status = device.RegisterReadOnlyHostMemory(pieces[i].data, pieces[i].size);
      registering += SecondsSince(before);
      if (!status.ok()) break;
      registered[i] = 1;  // each index is one thread's; read after the join
      status = device.CopyAsync(*streams[t], gpu + (i % slots) * piece_bytes, pieces[i].data,
                                pieces[i].size);
    }
    if (status.ok()) status = device.SynchronizeStream(*streams[t]);
    absl::MutexLock lock(&mu);
    first_error.Update(status);
    register_seconds += registering;
  };
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back(copy_pieces, t);
  for (std::thread& worker : workers) worker.join();
  times.to_gpu_seconds = SecondsSince(start);
  times.register_seconds = register_seconds;

  const Clock::time_point unregistering = Clock::now();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!registered[i]) continue;
    first_error.Update(device.UnregisterHostMemory(const_cast<uint8_t*>(pieces[i].data)));
  }
  unmap_all();
  times.unregister_seconds = SecondsSince(unregistering);
  if (!first_error.ok()) return first_error;
  return times;
}

}  // namespace tierd::bench
