// The daemon's tiers in one process on the host backend, for the fuzzers: a device, the storage
// stack (a catalog with one small registered model, the host arena and cache, the disk reader, the
// spill writer) and the GPU tier. Built once per fuzzer process (the first call) and shared by
// every input.
#ifndef TIERD_FUZZ_FUZZ_STACK_H_
#define TIERD_FUZZ_FUZZ_STACK_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "device/host_device.h"
#include "gpu/gpu_tier.h"
#include "server/session_protocol.h"
#include "storage/storage_stack.h"

namespace tierd::fuzzing {

struct FuzzStack {
  // The stack, built on first use; aborts if it cannot be built.
  static FuzzStack& Get();

  // Aborts, naming what is left, unless within 10 s no session is open and nothing is leased,
  // reserved or pinned: what every input must leave behind once its session is closed.
  void ExpectNothingHeld();

  std::string state_dir;
  std::unique_ptr<HostDevice> device;
  std::unique_ptr<StorageStack> storage;  // without a durable store
  std::unique_ptr<GpuTier> tier;
  SessionOptions session_options;
  // Keys of the registered model "m" ("m/blocks.N"), and each tensor's bytes by name: what a
  // lease's tensors must hold.
  std::vector<std::string> model_keys;
  std::map<std::string, std::string> tensor_bytes;
};

}  // namespace tierd::fuzzing

#endif  // TIERD_FUZZ_FUZZ_STACK_H_
