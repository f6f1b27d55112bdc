#include "fuzz/fuzz_stack.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/safetensors_writer.h"

namespace tierd::fuzzing {
namespace {

// A tensor of `rows` × 64 F32 whose bytes follow from `seed`.
TensorToWrite MakeTensor(const std::string& name, uint64_t rows, uint64_t seed) {
  TensorToWrite tensor{name, "F32", {rows, 64}, std::string(rows * 64 * 4, '\0')};
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (char& byte : tensor.data) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    byte = static_cast<char>(state >> 56);
  }
  return tensor;
}

template <typename T>
T OrDie(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) {
    std::fprintf(stderr, "fuzz stack: %s: %s\n", what, value.status().ToString().c_str());
    std::abort();
  }
  return *std::move(value);
}

FuzzStack* Build() {
  auto* stack = new FuzzStack;
  char dir_template[] = "/tmp/tierd-fuzz-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) std::abort();
  stack->state_dir = dir_template;
  // Model "m": 4 blocks of two F32 tensors, 16 KiB and 8 KiB each.
  std::vector<TensorToWrite> tensors;
  for (int block = 0; block < 4; ++block) {
    tensors.push_back(MakeTensor(absl::StrCat("blocks.", block, ".attn.weight"), 64, 100 + block));
    tensors.push_back(MakeTensor(absl::StrCat("blocks.", block, ".ffn.weight"), 32, 200 + block));
  }
  const std::string model_dir = absl::StrCat(stack->state_dir, "/model");
  ::mkdir(model_dir.c_str(), 0755);
  if (!WriteSafetensors(absl::StrCat(model_dir, "/model.safetensors"), tensors).ok()) {
    std::abort();
  }
  stack->device = OrDie(HostDevice::Create(), "host device");
  StorageStackOptions storage;
  storage.state_dir = absl::StrCat(stack->state_dir, "/state");
  storage.spill_dir = absl::StrCat(stack->state_dir, "/spill");
  storage.durable_store = false;
  storage.arena = {1 << 20, 1 << 20};
  storage.reader.threads = 1;
  storage.reader.queue_depth = 4;
  storage.reader.chunk_bytes = 64 << 10;
  storage.reader.direct = false;
  stack->storage = OrDie(StorageStack::Create(*stack->device, storage), "storage stack");
  const ModelSummary summary =
      OrDie(stack->storage->catalog().RegisterModel("m", model_dir, Grouping::kBlock,
                                                    GroupingRules::Defaults(), nullptr),
            "registering the model");
  (void)summary;
  GpuTierOptions gpu;
  gpu.pool_bytes = 256 << 10;  // room for a few blocks: evictions and waits happen
  gpu.slab_bytes = 128 << 10;
  gpu.close_grace = absl::Milliseconds(200);
  stack->tier = OrDie(GpuTier::Create(*stack->device, stack->storage->catalog(),
                                      stack->storage->arena(), stack->storage->host_cache(), gpu),
                      "GPU tier");
  stack->session_options.backend = "host";
  stack->session_options.device = "host";
  stack->session_options.limits.max_leases = 8;
  stack->session_options.limits.max_staging_bytes = 256 << 10;
  stack->session_options.max_key_bytes = 128;
  stack->session_options.max_tensors = 16;
  for (int block = 0; block < 4; ++block)
    stack->model_keys.push_back(absl::StrCat("m/blocks.", block));
  for (const TensorToWrite& tensor : tensors) stack->tensor_bytes[tensor.name] = tensor.data;
  return stack;
}

}  // namespace

FuzzStack& FuzzStack::Get() {
  static FuzzStack* stack = Build();
  return *stack;
}

void FuzzStack::ExpectNothingHeld() {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  GpuTierStats stats;
  while (true) {
    stats = tier->stats();
    if (stats.clients == 0 && stats.leases == 0 && stats.reservations == 0 && stats.pins == 0) {
      return;
    }
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  std::fprintf(stderr,
               "fuzz: a closed session left %llu session(s), %llu lease(s), %llu reservation(s), "
               "%llu pin(s) behind\n",
               static_cast<unsigned long long>(stats.clients),
               static_cast<unsigned long long>(stats.leases),
               static_cast<unsigned long long>(stats.reservations),
               static_cast<unsigned long long>(stats.pins));
  std::abort();
}

}  // namespace tierd::fuzzing
