// What gpu_path_bench's modes share: a session with a daemon that knows the model, the plain-copy
// reference, and the checks that end the benchmark on an error.
#ifndef TIERD_BENCH_GPU_PATH_SESSION_H_
#define TIERD_BENCH_GPU_PATH_SESSION_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_model.h"
#include "bench/bench_support.h"
#include "bench/gpu_path_flags.h"
#include "client/tierd_client.h"
#include "common/directory.h"
#include "device/pinned_host_buffer.h"
#include "nlohmann/json.hpp"

namespace tierd::bench {

class Bench {
 public:
  Bench() {
    tierd::ClientOptions options;
    options.socket_path = absl::GetFlag(FLAGS_socket);
    options.client_name = "gpu_path_bench";
    options.call_timeout = absl::Minutes(10);
    client_ = Check(tierd::Client::Connect(options), "connecting");
    session_ = Check(client_->OpenSession(), "opening a session");
    stream_ = Check(device().CreateStream(tierd::StreamPriority::kHigh), "creating a stream");
    model_ = absl::GetFlag(FLAGS_model);
    objects_ = RegisteredObjects(*client_, model_, absl::GetFlag(FLAGS_model_dir));
  }

  tierd::Client& client() { return *client_; }
  tierd::Session& session() { return *session_; }
  tierd::Device& device() { return session_->device(); }
  tierd::Stream& stream() { return *stream_; }
  const std::string& model() const { return model_; }
  const std::vector<Object>& objects() const { return objects_; }

  // The model's files, as the daemon registered them.
  std::vector<std::string> Files() const {
    std::string directory;
    for (const tierd::v1::ModelSummary& summary : Check(client_->ListModels(), "ListModels")) {
      if (summary.name() == model_) directory = summary.directory();
    }
    std::vector<std::string> files;
    for (const std::string& name : Check(tierd::ListDirectory(directory), "listing " + directory)) {
      if (absl::EndsWith(name, ".safetensors")) files.push_back(absl::StrCat(directory, "/", name));
    }
    std::sort(files.begin(), files.end());
    return files;
  }

  // Fetches `objects` on stream() and waits for their bytes; returns the seconds that took.
  // `prefetch_first` sends one prefetch of them all before the fetches, as a loader does.
  double FetchAll(const std::vector<Object>& objects, bool prefetch_first) {
    return Check(FetchAndWait(session(), stream(), objects, prefetch_first), "fetching");
  }

  // Evicts the model (or `prefix`) from `tier`, waiting for draining releases.
  void Evict(const std::string& prefix, tierd::v1::Tier tier) {
    Check(EvictWaiting(session(), prefix, tier), "evict " + prefix);
  }

 private:
  std::unique_ptr<tierd::Client> client_;
  std::unique_ptr<tierd::Session> session_;
  std::unique_ptr<tierd::Stream> stream_;
  std::string model_;
  std::vector<Object> objects_;
};

// The date, device and model, which every result carries.
nlohmann::json Environment(Bench& bench);

// Plain copies of `sizes` (bytes each) from pinned `host` memory to `device_memory` (host→device)
// or back, back to back on `stream`, spread over the buffers as distinct objects are. Seconds.
double PlainCopies(tierd::Device& device, tierd::Stream& stream, uint8_t* dst, const uint8_t* src,
                   uint64_t buffer_bytes, const std::vector<uint64_t>& sizes);

struct Buffers {
  std::unique_ptr<tierd::PinnedHostBuffer> host;
  std::unique_ptr<tierd::Slab> gpu;
};

// A pinned host buffer filled with a pattern and a GPU buffer, of `bytes` each.
Buffers AllocateBuffers(tierd::Device& device, uint64_t bytes);

// The modes (gpu_path_throughput.cc, gpu_path_latency.cc); each returns its result as JSON.
nlohmann::json Warm(Bench& bench);
nlohmann::json Cold(Bench& bench);
nlohmann::json Duplex(Bench& bench);
nlohmann::json Latency(Bench& bench);

}  // namespace tierd::bench

#endif  // TIERD_BENCH_GPU_PATH_SESSION_H_
