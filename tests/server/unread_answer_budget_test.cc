// UnreadAnswerBudget: what each connection may queue, and what all of them may together.
#include "server/unread_answer_budget.h"

#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

TEST(UnreadAnswerBudgetTest, AChargePastTheBudgetByTheLargestHolderIsRefusedAndChargesNothing) {
  UnreadAnswerBudget budget(1000);
  UnreadAnswerBudget::Account first(budget);
  UnreadAnswerBudget::Account second(budget);
  DeferredCalls::Calls cuts;
  EXPECT_THAT(first.Charge(600, cuts), IsOk());
  EXPECT_THAT(second.Charge(300, cuts), IsOk());
  // The first, holding the most, asks for more than the budget has left: it is the one cut.
  const absl::Status refused = first.Charge(200, cuts);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("past --max-unread-answer-bytes"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("it holds the most"));
  EXPECT_TRUE(cuts.empty());
  EXPECT_EQ(first.bytes(), 600u);
  EXPECT_EQ(budget.charged(), 900u);
  first.Release(600);
  EXPECT_THAT(second.Charge(500, cuts), IsOk());
  EXPECT_EQ(budget.charged(), 800u);
}

// A client that does not read holds most of the budget; another, reading as it goes, needs a
// little more: the hoarder is cut, not the reader (of whatever client group either is).
TEST(UnreadAnswerBudgetTest, WhenTheBudgetIsSpentTheLargestHolderIsCutNotTheOneCharging) {
  UnreadAnswerBudget budget(1000);
  UnreadAnswerBudget::Account hoarder(budget);
  UnreadAnswerBudget::Account middle(budget);
  UnreadAnswerBudget::Account reader(budget);
  int hoarder_cut = 0, middle_cut = 0;
  hoarder.OnCut([&] { ++hoarder_cut; });
  middle.OnCut([&] { ++middle_cut; });
  DeferredCalls::Calls cuts;
  ASSERT_THAT(hoarder.Charge(700, cuts), IsOk());
  ASSERT_THAT(middle.Charge(250, cuts), IsOk());
  ASSERT_THAT(reader.Charge(10, cuts), IsOk());
  EXPECT_TRUE(cuts.empty());
  // 960 charged: 100 more does not fit, and the hoarder holds the most.
  EXPECT_THAT(reader.Charge(100, cuts), IsOk());
  ASSERT_EQ(cuts.size(), 1u);
  for (auto& cut : cuts) std::move(cut)();
  cuts.clear();
  EXPECT_EQ(hoarder_cut, 1);
  EXPECT_EQ(middle_cut, 0);
  EXPECT_EQ(budget.charged(), 360u);  // the hoarder's 700 no longer count
  // Being cut, the hoarder may queue no more; what it drops does not count twice.
  EXPECT_THAT(hoarder.Charge(1, cuts), StatusIs(absl::StatusCode::kResourceExhausted));
  hoarder.Release(700);
  EXPECT_EQ(budget.charged(), 360u);
  // Several may have to go for one charge; the charging one never goes while another holds more.
  ASSERT_THAT(reader.Charge(300, cuts), IsOk());  // 660: middle 250, reader 410
  EXPECT_THAT(reader.Charge(400, cuts), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(cuts.empty());
}

TEST(UnreadAnswerBudgetTest, OneConnectionMayQueueNoMoreThanItsLimit) {
  UnreadAnswerBudget large(4 * UnreadAnswerBudget::kMaxPerConnection);
  EXPECT_EQ(large.per_connection_limit(), UnreadAnswerBudget::kMaxPerConnection);
  UnreadAnswerBudget::Account account(large);
  DeferredCalls::Calls cuts;
  EXPECT_THAT(account.Charge(UnreadAnswerBudget::kMaxPerConnection, cuts), IsOk());
  const absl::Status refused = account.Charge(1, cuts);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("more than one connection may queue"));
  // A budget below the per-connection limit is the limit.
  EXPECT_EQ(UnreadAnswerBudget(1 << 20).per_connection_limit(), 1u << 20);
}

TEST(UnreadAnswerBudgetTest, AnAccountGivesBackWhatItHoldsWhenDestroyed) {
  UnreadAnswerBudget budget(1000);
  std::optional<UnreadAnswerBudget::Account> account(std::in_place, budget);
  DeferredCalls::Calls cuts;
  ASSERT_THAT(account->Charge(700, cuts), IsOk());
  account->Release(200);
  EXPECT_EQ(budget.charged(), 500u);
  account.reset();
  EXPECT_EQ(budget.charged(), 0u);
}

TEST(UnreadAnswerBudgetTest, TheDefaultIsBetween64MiBAnd1GiB) {
  const uint64_t chosen = DefaultMaxUnreadAnswerBytes();
  EXPECT_GE(chosen, 64u << 20);
  EXPECT_LE(chosen, 1u << 30);
}

}  // namespace
}  // namespace tierd
