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

TEST(UnreadAnswerBudgetTest, AChargePastTheDaemonsBudgetIsRefusedAndChargesNothing) {
  UnreadAnswerBudget budget(1000);
  UnreadAnswerBudget::Account first(budget);
  UnreadAnswerBudget::Account second(budget);
  EXPECT_THAT(first.Charge(600), IsOk());
  const absl::Status refused = second.Charge(500);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("past --max-unread-answer-bytes"));
  EXPECT_EQ(second.bytes(), 0u);
  EXPECT_EQ(budget.charged(), 600u);
  EXPECT_THAT(second.Charge(400), IsOk());
  first.Release(600);
  EXPECT_THAT(second.Charge(500), IsOk());
  EXPECT_EQ(budget.charged(), 900u);
}

TEST(UnreadAnswerBudgetTest, OneConnectionMayQueueNoMoreThanItsLimit) {
  UnreadAnswerBudget large(4 * UnreadAnswerBudget::kMaxPerConnection);
  EXPECT_EQ(large.per_connection_limit(), UnreadAnswerBudget::kMaxPerConnection);
  UnreadAnswerBudget::Account account(large);
  EXPECT_THAT(account.Charge(UnreadAnswerBudget::kMaxPerConnection), IsOk());
  const absl::Status refused = account.Charge(1);
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("more than one connection may queue"));
  // A budget below the per-connection limit is the limit.
  EXPECT_EQ(UnreadAnswerBudget(1 << 20).per_connection_limit(), 1u << 20);
}

TEST(UnreadAnswerBudgetTest, AnAccountGivesBackWhatItHoldsWhenDestroyed) {
  UnreadAnswerBudget budget(1000);
  std::optional<UnreadAnswerBudget::Account> account(std::in_place, budget);
  ASSERT_THAT(account->Charge(700), IsOk());
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
