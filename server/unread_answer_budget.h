// The memory answers take while their clients do not read them, bounded across the daemon. Each
// session-socket connection and gRPC Session stream queues the answers its client has not taken
// yet; without a common bound, a few hundred clients that never read could hold the daemon's
// memory (each may queue up to kMaxPerConnection). Every connection charges its queued bytes to
// one UnreadAnswerBudget (--max-unread-answer-bytes) through an Account.
//
// Who is cut when the budget is spent: the connection that holds the most. A charge that would
// take one connection past per_connection_limit() is refused, and its transport cuts it (drops
// its queue, releasing its charge, and ends the session). A charge that would take the daemon past
// the budget cuts the largest holder instead — unless that is the charging connection itself — so
// that a client that reads its answers, of whatever client group, is never cut because another
// hoards: the largest holder's charge is taken off the budget at once, and its transport is told
// to cut it (Account::OnCut). The scan over the accounts happens only when the budget is spent.
#ifndef TIERD_SERVER_UNREAD_ANSWER_BUDGET_H_
#define TIERD_SERVER_UNREAD_ANSWER_BUDGET_H_

#include <algorithm>
#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/deferred_calls.h"

namespace tierd {

class UnreadAnswerBudget {
 public:
  // What one connection may queue, whatever the budget.
  static constexpr uint64_t kMaxPerConnection = 256ull << 20;

  // REQUIRES: budget_bytes > 0.
  explicit UnreadAnswerBudget(uint64_t budget_bytes) : budget_(budget_bytes) {}
  // REQUIRES: every Account is gone.
  ~UnreadAnswerBudget() = default;
  UnreadAnswerBudget(const UnreadAnswerBudget&) = delete;
  UnreadAnswerBudget& operator=(const UnreadAnswerBudget&) = delete;

  uint64_t budget() const { return budget_; }
  // kMaxPerConnection, but never more than the budget.
  uint64_t per_connection_limit() const { return std::min(kMaxPerConnection, budget_); }
  // Bytes charged now, over every connection not being cut. Thread-safe.
  uint64_t charged() const ABSL_LOCKS_EXCLUDED(mu_);

  // One connection's share of the budget. Thread-safe (the budget's lock guards what every
  // account holds: a charge on one connection may cut another). Releases what it holds when
  // destroyed.
  class Account {
   public:
    explicit Account(UnreadAnswerBudget& budget);
    ~Account();
    Account(const Account&) = delete;
    Account& operator=(const Account&) = delete;

    // How the connection is cut when another connection's charge needs room and this one holds
    // the most: the call is handed to that charge's caller, to make with its own locks released.
    // It may come after this account is gone, so it must hold the connection weakly.
    void OnCut(absl::AnyInvocable<void() &&> cut);

    // Charges `bytes` more to this connection. OK — having perhaps cut larger holders, whose cuts
    // are appended to `cuts` — or RESOURCE_EXHAUSTED, charging nothing, when this connection
    // would pass per_connection_limit(), would hold the most with the daemon past its budget, or
    // is being cut already. The message says which, for the log line of the cut.
    absl::Status Charge(uint64_t bytes, DeferredCalls::Calls& cuts);
    // Gives back `bytes` of what was charged (answers sent, or dropped).
    void Release(uint64_t bytes);
    // What this connection has charged and not released.
    uint64_t bytes() const;

   private:
    UnreadAnswerBudget& budget_;
  };

 private:
  // What one account holds.
  struct Holder {
    uint64_t bytes = 0;
    // Cut to make room for others: its bytes no longer count, and it may charge no more.
    bool cut = false;
    absl::AnyInvocable<void() &&> on_cut;
  };

  absl::Status ChargeLocked(Holder& holder, uint64_t bytes, DeferredCalls::Calls& cuts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The holder, other than `except`, that holds the most and is not being cut; null for none.
  Holder* LargestLocked(const Holder* except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t budget_;
  mutable absl::Mutex mu_;
  uint64_t charged_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const Account*, Holder> holders_ ABSL_GUARDED_BY(mu_);
};

// After a transport dropped `bytes` of queued answers: when that is a lot (16 MiB or more), gives
// the heap's free memory back to the system (malloc_trim), which freeing many small answers does
// not do by itself.
void ReturnMemoryAfterDropping(uint64_t bytes);

// The default of --max-unread-answer-bytes: MemAvailable / 16, at least 64 MiB and at most 1 GiB
// (1 GiB when /proc/meminfo cannot be read).
uint64_t DefaultMaxUnreadAnswerBytes();

}  // namespace tierd

#endif  // TIERD_SERVER_UNREAD_ANSWER_BUDGET_H_
