#include "gpu/detail/scratch_ring.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tierd {

ScratchRing::ScratchRing(Device& device, Stream& writer, Stream& reader, uint8_t* base,
                         uint64_t capacity, uint64_t granule)
    : device_(device),
      writer_(writer),
      reader_(reader),
      base_(base),
      capacity_(capacity),
      granule_(granule) {}

absl::StatusOr<uint8_t*> ScratchRing::Take(uint64_t bytes) {
  RETURN_IF_ERROR(broken_);
  if (open_) return absl::FailedPreconditionError("a scratch range was not given back");
  if (bytes == 0 || bytes > capacity_) {
    return absl::InvalidArgumentError(
        absl::StrCat(bytes, " bytes of scratch from a ring of ", capacity_));
  }
  const uint64_t size = (bytes + granule_ - 1) & ~(granule_ - 1);
  uint64_t start = head_;
  if (start % capacity_ + size > capacity_) start += capacity_ - start % capacity_;  // wrap
  const uint64_t end = start + size;
  // What was there: the ranges that started before end - capacity. Wait for the newest.
  if (end > capacity_) {
    std::unique_ptr<Event> newest;
    while (!taken_.empty() && taken_.front().start < end - capacity_) {
      if (newest != nullptr) spare_events_.push_back(std::move(newest));
      newest = std::move(taken_.front().read);
      taken_.pop_front();
    }
    if (newest != nullptr) {
      absl::Status waited = device_.WaitEvent(writer_, *newest);
      spare_events_.push_back(std::move(newest));
      if (!waited.ok()) {
        broken_ = std::move(waited);
        return broken_;
      }
    }
  }
  head_ = end;
  open_start_ = start;
  open_ = true;
  return base_ + start % capacity_;
}

absl::Status ScratchRing::GiveBack() {
  if (!open_) return absl::FailedPreconditionError("no scratch range to give back");
  open_ = false;
  std::unique_ptr<Event> read;
  if (!spare_events_.empty()) {
    read = std::move(spare_events_.back());
    spare_events_.pop_back();
  } else if (absl::StatusOr<std::unique_ptr<Event>> created = device_.CreateEvent(); created.ok()) {
    read = *std::move(created);
  } else {
    broken_ = created.status();
    return broken_;
  }
  if (absl::Status recorded = device_.RecordEvent(*read, reader_); !recorded.ok()) {
    broken_ = std::move(recorded);
    return broken_;
  }
  taken_.push_back(Taken{open_start_, std::move(read)});
  return absl::OkStatus();
}

}  // namespace tierd
