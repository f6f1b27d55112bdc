#include "server/unread_answer_budget.h"

#include <malloc.h>


#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/machine.h"

namespace tierd {

absl::Status UnreadAnswerBudget::Account::Charge(uint64_t bytes) {
  if (bytes_ + bytes > budget_.per_connection_limit()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the client has not read ", FormatByteSize(bytes_ + bytes),
                     " of answers, more than one connection may queue (",
                     FormatByteSize(budget_.per_connection_limit()), ")"));
  }
  uint64_t charged = budget_.charged_.load(std::memory_order_relaxed);
  do {
    if (charged + bytes > budget_.budget_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the client has not read ", FormatByteSize(bytes_ + bytes),
                       " of answers, and the daemon's clients ", FormatByteSize(charged + bytes),
                       ", past --max-unread-answer-bytes (", FormatByteSize(budget_.budget_), ")"));
    }
  } while (
      !budget_.charged_.compare_exchange_weak(charged, charged + bytes, std::memory_order_relaxed));
  bytes_ += bytes;
  return absl::OkStatus();
}

void UnreadAnswerBudget::Account::Release(uint64_t bytes) {
  bytes = std::min(bytes, bytes_);
  bytes_ -= bytes;
  budget_.charged_.fetch_sub(bytes, std::memory_order_relaxed);
}

void ReturnMemoryAfterDropping(uint64_t bytes) {
  constexpr uint64_t kWorthTrimming = 16ull << 20;
  if (bytes >= kWorthTrimming) ::malloc_trim(0);
}

uint64_t DefaultMaxUnreadAnswerBytes() {
  constexpr uint64_t kFloor = 64ull << 20;
  constexpr uint64_t kCeiling = 1ull << 30;
  absl::StatusOr<uint64_t> available = AvailableMemoryBytes();
  if (!available.ok()) return kCeiling;
  return std::clamp<uint64_t>(*available / 16, kFloor, kCeiling);
}

}  // namespace tierd
