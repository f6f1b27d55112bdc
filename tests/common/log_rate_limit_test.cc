// LogRateLimit, behind TIERD_LOG_EVERY_N_SEC: one line per period, and a count of those held back.
#include <sstream>

#include "absl/time/clock.h"
#include "common/log.h"
#include "gtest/gtest.h"

namespace tierd {
namespace {

TEST(LogRateLimitTest, LetsOneLineThroughPerPeriodAndCountsTheOthers) {
  LogRateLimit limit(/*period_seconds=*/0.3);
  EXPECT_EQ(limit.Take(), 0);
  EXPECT_EQ(limit.Take(), -1);
  EXPECT_EQ(limit.Take(), -1);
  absl::SleepFor(absl::Milliseconds(350));
  EXPECT_EQ(limit.Take(), 2);  // the two held back
  EXPECT_EQ(limit.Take(), -1);
}

TEST(LogRateLimitTest, SaysHowManyLinesWereLeftOut) {
  std::ostringstream none;
  none << LinesLeftOut{0} << "cut";
  EXPECT_EQ(none.str(), "cut");
  std::ostringstream some;
  some << LinesLeftOut{3} << "cut";
  EXPECT_EQ(some.str(), "(3 similar lines left out) cut");
}

}  // namespace
}  // namespace tierd
