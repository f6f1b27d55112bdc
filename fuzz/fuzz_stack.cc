#include "fuzz/fuzz_stack.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/storage_test_support.h"

namespace tierd::fuzzing {
namespace {

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
  std::vector<testing::TensorSpec> tensors;
  for (int block = 0; block < 4; ++block) {
    tensors.push_back(testing::RandomTensor(absl::StrCat("blocks.", block, ".attn.weight"), "F32",
                                            {64, 64}, 100 + block));
    tensors.push_back(testing::RandomTensor(absl::StrCat("blocks.", block, ".ffn.weight"), "F32",
                                            {32, 64}, 200 + block));
  }
  const std::string model_dir = absl::StrCat(stack->state_dir, "/model");
  ::mkdir(model_dir.c_str(), 0755);
  if (!testing::WriteSafetensors(absl::StrCat(model_dir, "/model.safetensors"), tensors).ok()) {
    std::abort();
  }
  stack->device = OrDie(HostDevice::Create(), "host device");
  stack->catalog = OrDie(Catalog::Open(absl::StrCat(stack->state_dir, "/state")), "catalog");
  const ModelSummary summary =
      OrDie(stack->catalog->RegisterModel("m", model_dir, Grouping::kBlock,
                                          GroupingRules::Defaults(), nullptr),
            "registering the model");
  (void)summary;
  stack->arena = OrDie(HostArena::Create(*stack->device, {1 << 20, 1 << 20}), "host arena");
  DiskReaderOptions reader;
  reader.threads = 1;
  reader.queue_depth = 4;
  reader.chunk_bytes = 64 << 10;
  reader.direct = false;
  stack->reader = OrDie(DiskReader::Create(reader), "disk reader");
  stack->spill = OrDie(SpillWriter::Create(absl::StrCat(stack->state_dir, "/spill")), "spill");
  stack->host_cache = std::make_unique<HostCache>(*stack->catalog, *stack->reader, *stack->arena,
                                                  stack->spill.get(), HostCacheOptions{});
  GpuTierOptions gpu;
  gpu.pool_bytes = 256 << 10;  // room for a few blocks: evictions and waits happen
  gpu.slab_bytes = 128 << 10;
  gpu.close_grace = absl::Milliseconds(200);
  stack->tier = OrDie(
      GpuTier::Create(*stack->device, *stack->catalog, *stack->arena, *stack->host_cache, gpu),
      "GPU tier");
  stack->session_options.backend = "host";
  stack->session_options.device = "host";
  stack->session_options.limits.max_leases = 8;
  stack->session_options.limits.max_staging_bytes = 256 << 10;
  stack->session_options.max_key_bytes = 128;
  stack->session_options.max_tensors = 16;
  for (int block = 0; block < 4; ++block)
    stack->model_keys.push_back(absl::StrCat("m/blocks.", block));
  for (const testing::TensorSpec& tensor : tensors) stack->tensor_bytes[tensor.name] = tensor.data;
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
