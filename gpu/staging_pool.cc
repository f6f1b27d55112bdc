#include "gpu/staging_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace tierd {
namespace {

uint64_t TotalSize(const std::vector<std::unique_ptr<Slab>>& slabs) {
  uint64_t total = 0;
  for (const auto& slab : slabs) total += slab->size();
  return total;
}

uint64_t LargestSize(const std::vector<std::unique_ptr<Slab>>& slabs) {
  uint64_t largest = 0;
  for (const auto& slab : slabs) largest = std::max<uint64_t>(largest, slab->size());
  return largest;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(Device& device,
                                                                 uint64_t pool_bytes,
                                                                 uint64_t slab_bytes) {
  if (pool_bytes == 0) return absl::InvalidArgumentError("the GPU pool needs a size");
  if (slab_bytes == 0) return absl::InvalidArgumentError("GPU slabs need a size");
  pool_bytes = RoundUp(pool_bytes, kStagingAlignment);
  slab_bytes = RoundUp(std::min(slab_bytes, pool_bytes), kStagingAlignment);
  std::vector<std::unique_ptr<Slab>> slabs;
  for (uint64_t allocated = 0; allocated < pool_bytes;) {
    const uint64_t bytes = std::min(slab_bytes, pool_bytes - allocated);
    absl::StatusOr<std::unique_ptr<Slab>> slab = device.AllocateSlab(bytes);
    if (!slab.ok()) {
      return absl::Status(slab.status().code(),
                          absl::StrCat("allocating GPU staging slab ", slabs.size(), " of ",
                                       FormatByteSize(bytes), ": ", slab.status().message()));
    }
    slabs.push_back(*std::move(slab));
    allocated += bytes;
  }
  return std::unique_ptr<StagingPool>(new StagingPool(std::move(slabs)));
}

StagingPool::StagingPool(std::vector<std::unique_ptr<Slab>> slabs)
    : slabs_(std::move(slabs)),
      capacity_(TotalSize(slabs_)),
      largest_slab_(LargestSize(slabs_)),
      free_(slabs_.size()) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < slabs_.size(); ++i) free_[i].Add(0, slabs_[i]->size());
}

void StagingAllocation::reset() {
  if (pool_ != nullptr && range_.size > 0) pool_->Free(range_);
  pool_ = nullptr;
  range_ = {};
}

std::optional<StagingAllocation> StagingPool::Allocate(uint64_t bytes) {
  // An empty object takes no room: an empty range, which Free ignores.
  if (bytes == 0) return StagingAllocation(this, StagingRange{0, 0, 0});
  if (bytes > largest_slab_) return std::nullopt;  // also keeps RoundUp from overflowing
  const uint64_t size = RoundUp(bytes, kStagingAlignment);
  absl::MutexLock lock(&mu_);
  for (uint32_t slab = 0; slab < free_.size(); ++slab) {
    if (std::optional<uint64_t> offset = free_[slab].Take(size)) {
      return StagingAllocation(this, StagingRange{slab, *offset, size});
    }
  }
  return std::nullopt;
}

std::optional<StagingAllocation> StagingPool::AllocateAt(const StagingRange& range) {
  if (range.size == 0 || range.slab >= slabs_.size() || range.size % kStagingAlignment != 0 ||
      range.offset % kStagingAlignment != 0) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  if (!free_[range.slab].TakeAt(range.offset, range.size)) return std::nullopt;
  return StagingAllocation(this, range);
}

void StagingPool::Free(const StagingRange& range) {
  if (range.size == 0) return;
  absl::MutexLock lock(&mu_);
  free_[range.slab].Add(range.offset, range.size);
}

uint8_t* StagingPool::data(const StagingRange& range) const {
  return static_cast<uint8_t*>(slabs_[range.slab]->data()) + range.offset;
}

uint64_t StagingPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t free = 0;
  for (const FreeRanges& ranges : free_) free += ranges.free_bytes();
  return capacity_ - free;
}

std::vector<StagingSlabInfo> StagingPool::Slabs() const {
  std::vector<StagingSlabInfo> infos;
  for (uint32_t i = 0; i < slabs_.size(); ++i) infos.push_back(SlabInfo(i));
  return infos;
}

StagingSlabInfo StagingPool::SlabInfo(uint32_t id) const {
  return {id, slabs_[id]->size(), slabs_[id]->handle()};
}

}  // namespace tierd
