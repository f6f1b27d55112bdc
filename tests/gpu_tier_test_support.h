// An in-process GPU tier for the tests of gpu/: the host device, a catalog with model "m" (blocks
// of one F32 tensor each, keys "m/blocks.N"), a small host arena, a disk reader and a host cache,
// and a GpuTier over them. Everything small: a few blocks of 64 KiB.
#ifndef TIERD_TESTS_GPU_TIER_TEST_SUPPORT_H_
#define TIERD_TESTS_GPU_TIER_TEST_SUPPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "device/host_device.h"
#include "gpu/gpu_tier.h"
#include "storage/host/host_arena.h"
#include "storage/host/host_cache.h"
#include "storage/io/disk_reader.h"
#include "storage/io/spill_writer.h"
#include "storage/model/catalog.h"
#include "tests/test_support.h"

namespace tierd::testing {

inline constexpr uint64_t kBlockBytes = 64 << 10;
inline constexpr absl::Duration kAnswerTimeout = absl::Seconds(30);

// The pattern seed of block N's bytes (see FillPattern).
inline uint64_t BlockSeed(int block) { return 1000 + block; }

class GpuTestStack {
 public:
  // Makes the device the stack uses out of the host device it creates (a test's wrapper).
  using WrapDevice = std::function<std::unique_ptr<Device>(Device& host)>;

  // Model "m" with `blocks` blocks of kBlockBytes; the arena (`arena_bytes`) holds all of them.
  // The stack uses `wrap`'s device when given, else the host device, and a host cache with
  // `host_cache`.
  static absl::StatusOr<std::unique_ptr<GpuTestStack>> Create(
      int blocks, const WrapDevice& wrap = nullptr, const HostCacheOptions& host_cache = {},
      uint64_t arena_bytes = 4ull << 20);
  ~GpuTestStack();

  // A GPU tier with `options` (pool_bytes and slab_bytes set by the caller). REQUIRES: at most one
  // tier at a time; reset tier before the stack goes.
  absl::Status StartTier(const GpuTierOptions& options);

  static std::string BlockKey(int block);
  // The bytes of block `block`, as the model file holds them.
  static std::string BlockBytes(int block);
  // The model's one file.
  std::string model_file() const;
  // A directory of the stack's, for more models.
  const std::string& dir() const { return dir_.path(); }

  Device& device() { return *device_; }
  Catalog& catalog() { return *catalog_; }
  HostArena& arena() { return *arena_; }
  HostCache& host_cache() { return *host_cache_; }
  std::unique_ptr<GpuTier> tier;

 private:
  GpuTestStack() = default;

  TempDir dir_;
  std::unique_ptr<Device> host_device_;
  std::unique_ptr<Device> device_;  // host_device_ itself, or the wrapper around it
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<DiskReader> reader_;
  std::unique_ptr<SpillWriter> spill_;
  std::unique_ptr<HostCache> host_cache_;
};

// One callback's answer, waited for with a timeout.
template <typename T>
struct Answer {
  absl::Notification ready;
  T value = absl::UnknownError("no answer");

  auto Callback() {
    return [this](T answer) {
      value = std::move(answer);
      ready.Notify();
    };
  }
  // The answer, or DEADLINE_EXCEEDED when none came in time.
  T Wait() {
    if (!ready.WaitForNotificationWithTimeout(kAnswerTimeout)) {
      return absl::DeadlineExceededError("no answer in time");
    }
    return std::move(value);
  }
};

// Fetches `key` for `client` and waits for the answer.
absl::StatusOr<LeaseGrant> FetchNow(GpuTier& tier, ClientId client, const std::string& key,
                                    FetchOptions options = {});
// Whether the lease's bytes in staging, once its ready event completed, are block `block`'s.
bool LeaseHoldsBlock(Device& device, GpuTier& tier, const LeaseGrant& lease, int block);
// Waits until no copy is in flight (stats().copies_in_flight == 0); false on timeout.
bool WaitForCopies(GpuTier& tier);

}  // namespace tierd::testing

#endif  // TIERD_TESTS_GPU_TIER_TEST_SUPPORT_H_
