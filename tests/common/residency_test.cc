#include "common/residency.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/deferred_calls.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::StatusIs;

// A memory of whole units: a Block owns some of it and gives it back when it goes.
class Budget {
 public:
  explicit Budget(uint64_t capacity) : free_(capacity) {}
  uint64_t free() const { return free_; }
  void Take(uint64_t bytes) { free_ -= bytes; }
  void Give(uint64_t bytes) { free_ += bytes; }

 private:
  uint64_t free_;
};

class Block {
 public:
  Block(Budget* budget, uint64_t size) : budget_(budget), size_(size) { budget_->Take(size); }
  Block(Block&& other) noexcept
      : budget_(std::exchange(other.budget_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  Block& operator=(Block&& other) noexcept {
    if (this != &other) {
      if (budget_ != nullptr) budget_->Give(size_);
      budget_ = std::exchange(other.budget_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~Block() {
    if (budget_ != nullptr) budget_->Give(size_);
  }
  uint64_t size() const { return size_; }

 private:
  Budget* budget_;
  uint64_t size_;
};

struct TestRecord {
  bool in_flight = false;
  bool can_be_had_again = true;
};

using Table = ResidencyTable<TestRecord, Block>;
using Entry = Table::Entry;

// An owner whose answers the tests set, and which records what the table asked it to do.
class TestOwner : public Table::Owner {
 public:
  TestOwner(uint64_t capacity, EvictionPolicy policy) : budget_(capacity) {
    table_.emplace(*this, policy);
  }
  Table& table() { return *table_; }

  bool InFlight(const Entry& entry) const override { return entry.in_flight; }
  bool CanEvict(const Entry& entry) const override { return entry.can_be_had_again; }
  void Evict(Entry& victim) override {
    evicted_.push_back(victim.key());
    table_->Drop(&victim);
    table_->Remove(&victim);
  }
  void Destroying(Entry& entry) override { destroyed_.push_back(entry.key()); }
  std::optional<Block> AllocateFree(uint64_t bytes) override {
    if (budget_.free() < bytes) return std::nullopt;
    return Block(&budget_, bytes);
  }
  bool WorthEvicting(uint64_t bytes, uint64_t evictable_bytes) override {
    return budget_.free() + evictable_bytes >= bytes;
  }
  bool RoomComing(uint64_t) override { return room_coming_; }
  absl::Status NoRoom(uint64_t bytes, bool after_waiting) override {
    return absl::ResourceExhaustedError(
        absl::StrCat(bytes, after_waiting ? " after waiting" : " at once"));
  }

  // A resident, listed entry of `bytes` under `key`.
  Entry* AddResident(const std::string& key, uint64_t bytes) {
    Entry* entry = table_->Create(key);
    entry->memory = Block(&budget_, bytes);
    table_->Publish(entry);
    table_->Enqueue(entry);
    return entry;
  }

  Budget budget_;
  std::optional<Table> table_;  // goes before the budget its blocks come from
  bool room_coming_ = false;
  std::vector<std::string> evicted_;
  std::vector<std::string> destroyed_;
};

// Collects the answers of Allocate, in the order they are given.
struct Answers {
  Table::AllocationCallback For(std::string name) {
    return [this, name = std::move(name)](absl::StatusOr<Block> block) {
      order.push_back(name);
      if (block.ok()) {
        blocks.push_back(*std::move(block));
      } else {
        errors.push_back(block.status());
      }
    };
  }
  std::vector<std::string> order;
  std::vector<Block> blocks;
  std::vector<absl::Status> errors;
};

TEST(ResidencyTableTest, FifoEvictsInOrderOfArrivalWhateverIsUsed) {
  TestOwner owner(3, EvictionPolicy::kFifo);
  Entry* a = owner.AddResident("a", 1);
  owner.AddResident("b", 1);
  owner.AddResident("c", 1);
  owner.table().Touch(a);
  std::optional<Block> block = owner.table().TryAllocate(1);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(owner.evicted_, std::vector<std::string>{"a"});
  EXPECT_EQ(owner.table().Find("a"), nullptr);
  EXPECT_NE(owner.table().Find("b"), nullptr);
}

TEST(ResidencyTableTest, LruEvictsTheLeastRecentlyUsed) {
  TestOwner owner(3, EvictionPolicy::kLru);
  Entry* a = owner.AddResident("a", 1);
  owner.AddResident("b", 1);
  owner.AddResident("c", 1);
  owner.table().Touch(a);
  std::optional<Block> block = owner.table().TryAllocate(2);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(owner.evicted_, (std::vector<std::string>{"b", "c"}));
  EXPECT_NE(owner.table().Find("a"), nullptr);
}

TEST(ResidencyTableTest, ReferencedPinnedBusyAndIrreplaceableEntriesAreNeverEvicted) {
  TestOwner owner(5, EvictionPolicy::kFifo);
  owner.AddResident("referenced", 1)->refs = 1;
  owner.AddResident("pinned", 1)->pins = 1;
  owner.AddResident("in flight", 1)->in_flight = true;
  owner.AddResident("only copy", 1)->can_be_had_again = false;
  owner.AddResident("evictable", 1);
  EXPECT_FALSE(owner.table().TryAllocate(2).has_value());
  // Evicting cannot make 2 units: nothing was evicted for nothing.
  EXPECT_TRUE(owner.evicted_.empty());
  std::optional<Block> one = owner.table().TryAllocate(1);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(owner.evicted_, std::vector<std::string>{"evictable"});
  EXPECT_FALSE(owner.table().TryAllocate(1).has_value());
  EXPECT_EQ(owner.evicted_.size(), 1u);
}

TEST(ResidencyTableTest, AnEntryNotInTheOrderIsNotEvictable) {
  TestOwner owner(2, EvictionPolicy::kFifo);
  Entry* loading = owner.table().Create("loading");
  loading->memory = Block(&owner.budget_, 2);
  owner.table().Publish(loading);
  EXPECT_FALSE(owner.table().IsEvictable(*loading));
  EXPECT_FALSE(owner.table().TryAllocate(1).has_value());
  owner.table().Enqueue(loading);  // now resident
  EXPECT_TRUE(owner.table().IsEvictable(*loading));
  EXPECT_TRUE(owner.table().TryAllocate(1).has_value());
}

TEST(ResidencyTableTest, AnUnlistedEntryLivesUntilItsLastUseEnds) {
  TestOwner owner(4, EvictionPolicy::kFifo);
  Entry* old_version = owner.AddResident("k", 2);
  old_version->refs = 1;
  old_version->pins = 1;
  owner.table().Remove(old_version);  // replaced while referenced and pinned
  EXPECT_EQ(owner.table().Find("k"), nullptr);
  EXPECT_FALSE(old_version->listed());
  EXPECT_FALSE(old_version->in_order());
  EXPECT_TRUE(owner.destroyed_.empty());
  Entry* new_version = owner.AddResident("k", 1);
  EXPECT_EQ(owner.table().Find("k"), new_version);
  EXPECT_EQ(owner.budget_.free(), 1u);

  old_version->refs = 0;
  EXPECT_FALSE(owner.table().FreeIfUnused(old_version));  // still pinned
  old_version->pins = 0;
  old_version->in_flight = true;
  EXPECT_FALSE(owner.table().FreeIfUnused(old_version));  // still in flight
  old_version->in_flight = false;
  EXPECT_TRUE(owner.table().FreeIfUnused(old_version));
  EXPECT_EQ(owner.destroyed_, std::vector<std::string>{"k"});
  EXPECT_EQ(owner.budget_.free(), 3u);  // its memory went with it
  // A listed entry is never freed that way.
  EXPECT_FALSE(owner.table().FreeIfUnused(new_version));
}

TEST(ResidencyTableTest, ARemovedEntryThatNothingUsesGoesAtOnce) {
  TestOwner owner(4, EvictionPolicy::kFifo);
  Entry* entry = owner.AddResident("k", 3);
  owner.table().Remove(entry);
  EXPECT_EQ(owner.destroyed_, std::vector<std::string>{"k"});
  EXPECT_EQ(owner.budget_.free(), 4u);
  EXPECT_TRUE(owner.table().listed().empty());
  EXPECT_TRUE(owner.table().order().empty());
}

TEST(ResidencyTableTest, DropFreesTheMemoryAndLeavesTheEntryListed) {
  TestOwner owner(4, EvictionPolicy::kFifo);
  Entry* entry = owner.AddResident("k", 3);
  owner.table().Drop(entry);
  EXPECT_EQ(owner.budget_.free(), 4u);
  EXPECT_FALSE(entry->memory.has_value());
  EXPECT_EQ(owner.table().Find("k"), entry);
  EXPECT_FALSE(entry->in_order());
  EXPECT_TRUE(owner.destroyed_.empty());
}

TEST(ResidencyTableTest, AllocateAnswersAtOnceWhenThereIsRoom) {
  TestOwner owner(2, EvictionPolicy::kFifo);
  Answers answers;
  {
    DeferredCalls deferred;
    owner.table().Allocate(2, answers.For("first"), deferred.calls());
    EXPECT_TRUE(answers.order.empty());  // answers are deferred, never run by the table
  }
  ASSERT_EQ(answers.blocks.size(), 1u);
  EXPECT_EQ(answers.blocks[0].size(), 2u);
  EXPECT_EQ(owner.table().waiting(), 0u);
}

TEST(ResidencyTableTest, WaitersAreAnsweredInOrderOfArrival) {
  TestOwner owner(3, EvictionPolicy::kFifo);
  Entry* held = owner.AddResident("held", 3);
  held->refs = 1;
  owner.room_coming_ = true;
  Answers answers;
  {
    DeferredCalls deferred;
    owner.table().Allocate(2, answers.For("first"), deferred.calls());
    owner.table().Allocate(1, answers.For("second"), deferred.calls());
  }
  EXPECT_EQ(owner.table().waiting(), 2u);
  // Room for the second alone: it does not pass the first.
  held->refs = 0;
  owner.table().Remove(held);
  Block third_party(&owner.budget_, 2);
  {
    DeferredCalls deferred;
    owner.table().RetryWaiters(deferred.calls());
  }
  EXPECT_TRUE(answers.order.empty());
  // A new request waits behind them even though there is room for it.
  {
    DeferredCalls deferred;
    owner.table().Allocate(1, answers.For("third"), deferred.calls());
  }
  EXPECT_EQ(owner.table().waiting(), 3u);
  EXPECT_TRUE(answers.order.empty());
  third_party = Block(&owner.budget_, 0);  // frees its 2 units
  {
    DeferredCalls deferred;
    owner.table().RetryWaiters(deferred.calls());
  }
  EXPECT_EQ(answers.order, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(owner.table().waiting(), 1u);
  answers.blocks.clear();
  {
    DeferredCalls deferred;
    owner.table().RetryWaiters(deferred.calls());
  }
  EXPECT_EQ(answers.order, (std::vector<std::string>{"first", "second", "third"}));
  EXPECT_TRUE(answers.errors.empty());
}

TEST(ResidencyTableTest, WithNoRoomComingARequestFailsAtOnce) {
  TestOwner owner(2, EvictionPolicy::kFifo);
  owner.AddResident("pinned", 2)->pins = 1;
  Answers answers;
  {
    DeferredCalls deferred;
    owner.table().Allocate(1, answers.For("refused"), deferred.calls());
  }
  ASSERT_EQ(answers.errors.size(), 1u);
  EXPECT_THAT(answers.errors[0], StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(answers.errors[0].message(), "1 at once");
  EXPECT_EQ(owner.table().waiting(), 0u);
}

TEST(ResidencyTableTest, AWaiterFailsOnceNoMoreRoomIsComing) {
  TestOwner owner(2, EvictionPolicy::kFifo);
  owner.AddResident("pinned", 2)->pins = 1;
  owner.room_coming_ = true;
  Answers answers;
  {
    DeferredCalls deferred;
    owner.table().Allocate(1, answers.For("first"), deferred.calls());
    owner.table().Allocate(1, answers.For("second"), deferred.calls());
  }
  EXPECT_EQ(owner.table().waiting(), 2u);
  owner.room_coming_ = false;  // e.g. the spill that was to make room failed
  {
    DeferredCalls deferred;
    owner.table().RetryWaiters(deferred.calls());
  }
  EXPECT_EQ(answers.order, (std::vector<std::string>{"first", "second"}));
  ASSERT_EQ(answers.errors.size(), 2u);
  EXPECT_EQ(answers.errors[0].message(), "1 after waiting");
  EXPECT_EQ(owner.table().waiting(), 0u);
}

TEST(ResidencyTableTest, AWaiterIsServedByEvictingWhatBecameEvictable) {
  TestOwner owner(2, EvictionPolicy::kFifo);
  Entry* referenced = owner.AddResident("referenced", 2);
  referenced->refs = 1;
  owner.room_coming_ = true;
  Answers answers;
  {
    DeferredCalls deferred;
    owner.table().Allocate(2, answers.For("waiter"), deferred.calls());
  }
  EXPECT_EQ(owner.table().waiting(), 1u);
  referenced->refs = 0;  // released: evictable now
  {
    DeferredCalls deferred;
    owner.table().RetryWaiters(deferred.calls());
  }
  EXPECT_EQ(owner.evicted_, std::vector<std::string>{"referenced"});
  ASSERT_EQ(answers.blocks.size(), 1u);
  EXPECT_EQ(answers.blocks[0].size(), 2u);
}

TEST(ResidencyTableTest, FailWaitersAnswersEveryWaiterInOrder) {
  TestOwner owner(1, EvictionPolicy::kFifo);
  owner.AddResident("pinned", 1)->pins = 1;
  owner.room_coming_ = true;
  Answers answers;
  {
    DeferredCalls deferred;
    owner.table().Allocate(1, answers.For("first"), deferred.calls());
    owner.table().Allocate(1, answers.For("second"), deferred.calls());
    owner.table().FailWaiters(absl::UnavailableError("shutting down"), deferred.calls());
  }
  EXPECT_EQ(answers.order, (std::vector<std::string>{"first", "second"}));
  ASSERT_EQ(answers.errors.size(), 2u);
  EXPECT_THAT(answers.errors[1], StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(owner.table().waiting(), 0u);
}

TEST(ResidencyTableTest, TheTableFreesTheMemoryOfWhatIsLeftWhenItGoes) {
  TestOwner owner(4, EvictionPolicy::kFifo);
  owner.AddResident("a", 1);
  Entry* unlisted = owner.AddResident("b", 2);
  unlisted->refs = 1;
  owner.table().Remove(unlisted);
  EXPECT_EQ(owner.budget_.free(), 1u);
  // Listed or not, the entries' memory goes back as the table goes; nothing is asked of the owner.
  owner.table_.reset();
  EXPECT_EQ(owner.budget_.free(), 4u);
  EXPECT_TRUE(owner.destroyed_.empty());
}

}  // namespace
}  // namespace tierd
