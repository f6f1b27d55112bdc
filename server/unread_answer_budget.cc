#include "server/unread_answer_budget.h"

#include <malloc.h>

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"

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
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "MemAvailable:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    uint64_t kib;
    if (!absl::ConsumeSuffix(&rest, "kB") ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) {
      break;
    }
    return std::clamp<uint64_t>(kib * 1024 / 16, kFloor, kCeiling);
  }
  return kCeiling;
}

}  // namespace tierd
