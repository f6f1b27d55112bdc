#include "tests/gpu_tier_test_support.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "tests/storage_test_support.h"

namespace tierd::testing {

absl::StatusOr<std::unique_ptr<GpuTestStack>> GpuTestStack::Create(
    int blocks, const WrapDevice& wrap, const HostCacheOptions& host_cache,
    uint64_t arena_bytes) {
  std::unique_ptr<GpuTestStack> stack(new GpuTestStack);
  const std::string model_dir = absl::StrCat(stack->dir_.path(), "/model");
  std::filesystem::create_directories(model_dir);
  std::vector<TensorSpec> tensors;
  for (int block = 0; block < blocks; ++block) {
    tensors.push_back(
        {absl::StrCat("blocks.", block, ".w"), "F32", {kBlockBytes / 4}, BlockBytes(block)});
  }
  RETURN_IF_ERROR(WriteSafetensors(absl::StrCat(model_dir, "/model.safetensors"), tensors));
  ASSIGN_OR_RETURN(stack->host_device_, HostDevice::Create());
  if (wrap) {
    stack->device_ = wrap(*stack->host_device_);
  } else {
    stack->device_ = std::move(stack->host_device_);
  }
  ASSIGN_OR_RETURN(stack->catalog_, Catalog::Open(absl::StrCat(stack->dir_.path(), "/state")));
  RETURN_IF_ERROR(
      stack->catalog_
          ->RegisterModel("m", model_dir, Grouping::kBlock, GroupingRules::Defaults(), nullptr)
          .status());
  ASSIGN_OR_RETURN(stack->arena_, HostArena::Create(*stack->device_, {arena_bytes, 1ull << 20}));
  if (!stack->arena_->WaitUntilFullyPinned(kAnswerTimeout)) {
    return absl::DeadlineExceededError("the host arena is not pinned");
  }
  DiskReaderOptions reader = ReaderOptions(1, 4, 64 << 10);
  reader.direct = false;
  ASSIGN_OR_RETURN(stack->reader_, DiskReader::Create(reader));
  ASSIGN_OR_RETURN(stack->spill_, SpillWriter::Create(absl::StrCat(stack->dir_.path(), "/spill")));
  stack->host_cache_ = std::make_unique<HostCache>(*stack->catalog_, *stack->reader_,
                                                   *stack->arena_, stack->spill_.get(), host_cache);
  return stack;
}

GpuTestStack::~GpuTestStack() {
  tier.reset();
  host_cache_.reset();
  spill_.reset();
  reader_.reset();
  arena_.reset();
  catalog_.reset();
}

absl::Status GpuTestStack::StartTier(const GpuTierOptions& options) {
  ASSIGN_OR_RETURN(tier, GpuTier::Create(*device_, *catalog_, *arena_, *host_cache_, options));
  return absl::OkStatus();
}

std::string GpuTestStack::BlockKey(int block) { return absl::StrCat("m/blocks.", block); }

std::string GpuTestStack::BlockBytes(int block) {
  return RandomTensor(absl::StrCat("blocks.", block, ".w"), "F32", {kBlockBytes / 4},
                      BlockSeed(block))
      .data;
}

std::string GpuTestStack::model_file() const {
  return absl::StrCat(dir_.path(), "/model/model.safetensors");
}

absl::StatusOr<LeaseGrant> FetchNow(GpuTier& tier, ClientId client, const std::string& key,
                                    FetchOptions options) {
  Answer<absl::StatusOr<LeaseGrant>> answer;
  tier.Fetch(client, key, ReadPriority::kDemand, absl::InfiniteFuture(), answer.Callback(),
             options);
  return answer.Wait();
}

bool LeaseHoldsBlock(Device& device, GpuTier& tier, const LeaseGrant& lease, int block) {
  if (lease.ready_event && !device.SynchronizeEvent(tier.events().event(*lease.ready_event)).ok()) {
    return false;
  }
  const uint8_t* bytes = tier.pool().data(lease.range);
  return FirstPatternMismatch(bytes, lease.length, BlockSeed(block)) < 0;
}

bool WaitForCopies(GpuTier& tier) {
  const absl::Time deadline = absl::Now() + kAnswerTimeout;
  while (tier.stats().copies_in_flight > 0) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace tierd::testing
