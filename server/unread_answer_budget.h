// The memory answers take while their clients do not read them, bounded across the daemon. Each
// session-socket connection and gRPC Session stream queues the answers its client has not taken
// yet; without a common bound, a few hundred clients that never read could hold the daemon's
// memory (each may queue up to kMaxPerConnection). Every connection charges its queued bytes to
// one UnreadAnswerBudget (--max-unread-answer-bytes) through an Account; a charge that would take
// the connection past per_connection_limit() or the daemon past the budget is refused, and the
// transport then cuts that connection: it drops the queue (releasing its charge) and ends the
// session.
#ifndef TIERD_SERVER_UNREAD_ANSWER_BUDGET_H_
#define TIERD_SERVER_UNREAD_ANSWER_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"

namespace tierd {

class UnreadAnswerBudget {
 public:
  // What one connection may queue, whatever the budget.
  static constexpr uint64_t kMaxPerConnection = 256ull << 20;

  // REQUIRES: budget_bytes > 0.
  explicit UnreadAnswerBudget(uint64_t budget_bytes) : budget_(budget_bytes) {}
  UnreadAnswerBudget(const UnreadAnswerBudget&) = delete;
  UnreadAnswerBudget& operator=(const UnreadAnswerBudget&) = delete;

  uint64_t budget() const { return budget_; }
  // kMaxPerConnection, but never more than the budget.
  uint64_t per_connection_limit() const { return std::min(kMaxPerConnection, budget_); }
  // Bytes charged now, over every connection. Thread-safe.
  uint64_t charged() const { return charged_.load(std::memory_order_relaxed); }

  // One connection's share of the budget. Not thread-safe: its owner's lock guards it. Releases
  // what it holds when destroyed.
  class Account {
   public:
    explicit Account(UnreadAnswerBudget& budget) : budget_(budget) {}
    ~Account() { Release(bytes_); }
    Account(const Account&) = delete;
    Account& operator=(const Account&) = delete;

    // Charges `bytes` more to this connection. RESOURCE_EXHAUSTED, charging nothing, when the
    // connection would pass per_connection_limit() or the daemon its budget; the message says
    // which, for the log line of the cut.
    absl::Status Charge(uint64_t bytes);
    // Gives back `bytes` of what was charged (answers sent, or dropped).
    void Release(uint64_t bytes);
    // What this connection has charged and not released.
    uint64_t bytes() const { return bytes_; }

   private:
    UnreadAnswerBudget& budget_;
    uint64_t bytes_ = 0;
  };

 private:
  const uint64_t budget_;
  std::atomic<uint64_t> charged_{0};
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
