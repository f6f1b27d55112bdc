#include "server/unread_answer_budget.h"

#include <malloc.h>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/machine.h"

namespace tierd {

uint64_t UnreadAnswerBudget::charged() const {
  absl::MutexLock lock(&mu_);
  return charged_;
}

UnreadAnswerBudget::Account* UnreadAnswerBudget::LargestLocked(const Account* except) const {
  Account* largest = nullptr;
  for (Account* account : accounts_) {
    if (account == except || account->cut_) continue;
    if (largest == nullptr || account->bytes_ > largest->bytes_) largest = account;
  }
  return largest;
}

UnreadAnswerBudget::Account::Account(UnreadAnswerBudget& budget) : budget_(budget) {
  absl::MutexLock lock(&budget_.mu_);
  budget_.accounts_.insert(this);
}

UnreadAnswerBudget::Account::~Account() {
  absl::MutexLock lock(&budget_.mu_);
  if (!cut_) budget_.charged_ -= bytes_;
  budget_.accounts_.erase(this);
}

void UnreadAnswerBudget::Account::OnCut(absl::AnyInvocable<void() &&> cut) {
  absl::MutexLock lock(&budget_.mu_);
  on_cut_ = std::move(cut);
}

absl::Status UnreadAnswerBudget::Account::Charge(uint64_t bytes, DeferredCalls::Calls& cuts) {
  absl::MutexLock lock(&budget_.mu_);
  if (cut_) {
    return absl::ResourceExhaustedError(
        "the client held the most unread answers when the daemon's budget was spent");
  }
  if (bytes_ + bytes > budget_.per_connection_limit()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the client has not read ", FormatByteSize(bytes_ + bytes),
                     " of answers, more than one connection may queue (",
                     FormatByteSize(budget_.per_connection_limit()), ")"));
  }
  while (budget_.charged_ + bytes > budget_.budget_) {
    Account* largest = budget_.LargestLocked(this);
    if (largest == nullptr || largest->bytes_ <= bytes_ + bytes) {
      // This connection would hold the most: it is the one cut.
      return absl::ResourceExhaustedError(absl::StrCat(
          "the client has not read ", FormatByteSize(bytes_ + bytes),
          " of answers, and the daemon's clients ", FormatByteSize(budget_.charged_ + bytes),
          ", past --max-unread-answer-bytes (", FormatByteSize(budget_.budget_),
          "); it holds the most"));
    }
    // Another holds more: it goes, however its client got there, and this one is served.
    TIERD_LOG_EVERY_N_SEC(WARNING, 10)
        << "a client has not read " << FormatByteSize(largest->bytes_)
        << " of answers, the most of any, and the daemon's clients are past "
           "--max-unread-answer-bytes ("
        << FormatByteSize(budget_.budget_) << "): cutting its session";
    budget_.charged_ -= largest->bytes_;
    largest->cut_ = true;
    if (largest->on_cut_) cuts.push_back(std::move(largest->on_cut_));
  }
  budget_.charged_ += bytes;
  bytes_ += bytes;
  return absl::OkStatus();
}

void UnreadAnswerBudget::Account::Release(uint64_t bytes) {
  absl::MutexLock lock(&budget_.mu_);
  bytes = std::min(bytes, bytes_);
  bytes_ -= bytes;
  if (!cut_) budget_.charged_ -= bytes;
}

uint64_t UnreadAnswerBudget::Account::bytes() const {
  absl::MutexLock lock(&budget_.mu_);
  return bytes_;
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
