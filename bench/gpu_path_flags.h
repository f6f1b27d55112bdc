// gpu_path_bench's flags, defined in gpu_path_bench.cc and read by its modes.
#ifndef TIERD_BENCH_GPU_PATH_FLAGS_H_
#define TIERD_BENCH_GPU_PATH_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "common/byte_size.h"

ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(std::string, socket);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, model_dir);
ABSL_DECLARE_FLAG(std::string, tensors);
ABSL_DECLARE_FLAG(std::string, weights);
ABSL_DECLARE_FLAG(bool, compressed);
ABSL_DECLARE_FLAG(int, files);
ABSL_DECLARE_FLAG(int, repeat);
ABSL_DECLARE_FLAG(int, fetches);
ABSL_DECLARE_FLAG(int, step_layers);
ABSL_DECLARE_FLAG(tierd::ByteSize, store_bytes);
ABSL_DECLARE_FLAG(int, stores);
ABSL_DECLARE_FLAG(std::string, fio);
ABSL_DECLARE_FLAG(int, fio_queue_depth);
ABSL_DECLARE_FLAG(std::vector<std::string>, pread_threads);
ABSL_DECLARE_FLAG(std::vector<std::string>, pread_copy_threads);
ABSL_DECLARE_FLAG(std::vector<std::string>, in_place_threads);
ABSL_DECLARE_FLAG(std::string, python);
ABSL_DECLARE_FLAG(std::string, safetensors_script);
ABSL_DECLARE_FLAG(std::string, json);

#endif  // TIERD_BENCH_GPU_PATH_FLAGS_H_
