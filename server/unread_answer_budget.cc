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

UnreadAnswerBudget::Holder* UnreadAnswerBudget::LargestLocked(const Holder* except) {
  Holder* largest = nullptr;
  for (auto& [account, holder] : holders_) {
    if (&holder == except || holder.cut) continue;
    if (largest == nullptr || holder.bytes > largest->bytes) largest = &holder;
  }
  return largest;
}

absl::Status UnreadAnswerBudget::ChargeLocked(Holder& holder, uint64_t bytes,
                                              DeferredCalls::Calls& cuts) {
  if (holder.cut) {
    return absl::ResourceExhaustedError(
        "the client held the most unread answers when the daemon's budget was spent");
  }
  if (holder.bytes + bytes > per_connection_limit()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the client has not read ", FormatByteSize(holder.bytes + bytes),
                     " of answers, more than one connection may queue (",
                     FormatByteSize(per_connection_limit()), ")"));
  }
  while (charged_ + bytes > budget_) {
    Holder* largest = LargestLocked(&holder);
    if (largest == nullptr || largest->bytes <= holder.bytes + bytes) {
      // This connection would hold the most: it is the one cut.
      return absl::ResourceExhaustedError(absl::StrCat(
          "the client has not read ", FormatByteSize(holder.bytes + bytes),
          " of answers, and the daemon's clients ", FormatByteSize(charged_ + bytes),
          ", past --max-unread-answer-bytes (", FormatByteSize(budget_), "); it holds the most"));
    }
    // Another holds more: it goes, however its client got there, and this one is served.
    TIERD_LOG_EVERY_N_SEC(WARNING, 10)
        << "a client has not read " << FormatByteSize(largest->bytes)
        << " of answers, the most of any, and the daemon's clients are past "
           "--max-unread-answer-bytes ("
        << FormatByteSize(budget_) << "): cutting its session";
    charged_ -= largest->bytes;
    largest->cut = true;
    if (largest->on_cut) cuts.push_back(std::move(largest->on_cut));
  }
  charged_ += bytes;
  holder.bytes += bytes;
  return absl::OkStatus();
}

UnreadAnswerBudget::Account::Account(UnreadAnswerBudget& budget) : budget_(budget) {
  absl::MutexLock lock(&budget_.mu_);
  budget_.holders_.emplace(this, Holder());
}

UnreadAnswerBudget::Account::~Account() {
  absl::MutexLock lock(&budget_.mu_);
  auto it = budget_.holders_.find(this);
  if (!it->second.cut) budget_.charged_ -= it->second.bytes;
  budget_.holders_.erase(it);
}

void UnreadAnswerBudget::Account::OnCut(absl::AnyInvocable<void() &&> cut) {
  absl::MutexLock lock(&budget_.mu_);
  budget_.holders_.at(this).on_cut = std::move(cut);
}

absl::Status UnreadAnswerBudget::Account::Charge(uint64_t bytes, DeferredCalls::Calls& cuts) {
  absl::MutexLock lock(&budget_.mu_);
  return budget_.ChargeLocked(budget_.holders_.at(this), bytes, cuts);
}

void UnreadAnswerBudget::Account::Release(uint64_t bytes) {
  absl::MutexLock lock(&budget_.mu_);
  Holder& holder = budget_.holders_.at(this);
  bytes = std::min(bytes, holder.bytes);
  holder.bytes -= bytes;
  if (!holder.cut) budget_.charged_ -= bytes;
}

uint64_t UnreadAnswerBudget::Account::bytes() const {
  absl::MutexLock lock(&budget_.mu_);
  return budget_.holders_.at(this).bytes;
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
