// gpu_path_bench: tierd's data path, through a running daemon and the C++ client, measured against
// what the hardware does with the same bytes in the same run.
//
//   gpu_path_bench --mode=make-model --model-dir=DIR --tensors=16MiBx64,700MiBx2 [--files=N]
//   gpu_path_bench --mode=warm|cold|duplex|latency --socket=SOCK --model=NAME --model-dir=DIR
//                  [--repeat=N] [--json=OUT]
//
// Modes (each reports medians over --repeat runs, baseline and tierd alternating):
//   warm     host cache → GPU staging: fetch every object of one size class (evicted from the GPU
//            first, resident in the host cache) and wait for the bytes, against cudaMemcpyAsync of
//            the same sizes from pinned memory on one stream. Target ≥ 0.95.
//   cold     disk → GPU with the page cache dropped: prefetch all objects, fetch each, wait,
//            against fio reading the same files with O_DIRECT (target ≥ 0.90; --fio= skips it,
//            as on tmpfs, which has no O_DIRECT), T threads pread-ing them into pinned memory
//            for each T of --pread-threads, and cudaMemcpyAsync of the same bytes from pinned
//            memory (the link): on memory-backed files the target is ≥ 0.90 × the smaller of the
//            best pread and the link. With --in-place-threads (for memory-backed files), the
//            files' pages registered with the device and copied with no CPU copy
//            (bench/in_place_copies.h). With --safetensors-script,
//            safetensors.torch.load_file(device="cuda") cold and warm too.
//   duplex   prefetch+fetch of the model (H2D) while another session stores objects (D2H) at
//            once, against two plain copies in opposite directions at once. Reference 72 GB/s.
//   latency  Fetch of an object already on the GPU through a session, --fetches times;
//            p50/p99 of the call (request sent → lease usable). Targets p50 ≤ 25 µs, p99 ≤ 100 µs.
//            Then a step of --step-layers objects, one Fetch (round trip) per object against one
//            FetchMany that also releases the last step's leases.
// The model is registered with per-tensor grouping (one object per tensor) when not yet known.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "bench/bench_support.h"
#include "bench/gpu_path_flags.h"
#include "bench/gpu_path_session.h"
#include "bench/model_writer.h"
#include "client/tierd_client.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "common/directory.h"
#include "device/pinned_host_buffer.h"

ABSL_FLAG(std::string, mode, "", "make-model, warm, cold, duplex or latency");
ABSL_FLAG(std::string, socket, "/run/tierd/gpu0.sock", "The daemon's socket");
ABSL_FLAG(std::string, model, "bench", "Name to register the model under");
ABSL_FLAG(std::string, model_dir, "", "Directory of the model's .safetensors files");
ABSL_FLAG(std::string, tensors, "16MiBx64,64MiBx16,256MiBx4,700MiBx2",
          "make-model: tensor sizes, SIZExCOUNT,...");
ABSL_FLAG(std::string, weights, "random",
          "make-model: the tensors' values, random (U8 bytes), normal (BF16 of N(0, 0.02^2)) or "
          "e4m3 (those weights quantised to F8_E4M3 with 128x128 block scales)");
ABSL_FLAG(bool, compressed, false,
          "warm: wait for the daemon (run with --compress-weights) to compress the model first");
ABSL_FLAG(int, files, 1, "make-model: files to spread the tensors over");
ABSL_FLAG(int, repeat, 5, "Timed runs of each side");
ABSL_FLAG(int, fetches, 20000, "latency: timed fetches");
ABSL_FLAG(int, step_layers, 48,
          "latency: objects (layers) in a timed step, Fetch by Fetch and FetchMany");
ABSL_FLAG(tierd::ByteSize, store_bytes, tierd::ByteSize{256ull << 20}, "duplex: bytes per store");
ABSL_FLAG(int, stores, 16, "duplex: stores per run");
ABSL_FLAG(std::string, fio, "fio",
          "cold: fio binary for the O_DIRECT reference; empty: no fio run (tmpfs)");
ABSL_FLAG(int, fio_queue_depth, 32, "cold: fio's queue depth (4 MiB reads, one job)");
ABSL_FLAG(std::vector<std::string>, pread_threads, std::vector<std::string>({"8", "16"}),
          "cold: thread counts of the pread-into-pinned-memory reference, a run each per repeat; "
          "empty: none");
ABSL_FLAG(std::vector<std::string>, pread_copy_threads, std::vector<std::string>({"16"}),
          "cold: thread counts of the pread-then-copy reference (the pread reference, each 4 MiB "
          "read copied on to the GPU at once on its thread's stream), a run each per repeat; "
          "empty: none. Needs --pread-threads");
ABSL_FLAG(std::vector<std::string>, in_place_threads, {},
          "cold, memory-backed files: thread counts of the in-place reference (the files mapped, "
          "their pages registered with the device piece by piece and copied to the GPU, no CPU "
          "copy), a run each per repeat; empty (the default): none");
ABSL_FLAG(std::string, python, "python3", "cold: Python with torch and safetensors");
ABSL_FLAG(std::string, safetensors_script, "",
          "cold: bench/safetensors_load.py, to time safetensors.torch.load_file; empty: skip");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace tierd::bench {
namespace {

int MakeModel() {
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) Die("--model-dir is required");
  WriteModel(dir, ParseTensorList(absl::GetFlag(FLAGS_tensors)), absl::GetFlag(FLAGS_files),
             /*row_bytes=*/0, ParseWeightValues(absl::GetFlag(FLAGS_weights)));
  return 0;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gpu_path_bench --mode=make-model|warm|cold|duplex|latency [--socket=SOCK] [--model=NAME] "
      "[--model-dir=DIR] [--json=OUT]");
  if (absl::StatusOr<std::vector<std::string>> parsed =
          tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
      !parsed.ok()) {
    std::fprintf(stderr, "gpu_path_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) absl::StrAppend(&command, i == 0 ? "" : " ", argv[i]);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "make-model") return MakeModel();
  nlohmann::json result;
  {
    Bench bench;
    if (mode == "warm") {
      result = Warm(bench);
    } else if (mode == "cold") {
      result = Cold(bench);
    } else if (mode == "duplex") {
      result = Duplex(bench);
    } else if (mode == "latency") {
      result = Latency(bench);
    } else {
      Die("--mode must be make-model, warm, cold, duplex or latency");
    }
  }
  result["command"] = command;
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) std::ofstream(json) << result.dump(2) << "\n";
  std::printf("%s\n", result.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace tierd::bench

int main(int argc, char** argv) { return tierd::bench::Main(argc, argv); }
