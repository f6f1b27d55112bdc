// FreeRanges: first fit, coalescing, and taking an exact range back (how a woken retained set's
// objects return to the device addresses they had).
#include "common/free_ranges.h"

#include <gtest/gtest.h>

namespace tierd {
namespace {

TEST(FreeRangesTest, TakesFirstFitAndCoalescesWhatComesBack) {
  FreeRanges ranges;
  ranges.Add(0, 100);
  EXPECT_EQ(ranges.Take(30), 0u);
  EXPECT_EQ(ranges.Take(30), 30u);
  ranges.Add(0, 30);
  EXPECT_EQ(ranges.free_bytes(), 70u);
  EXPECT_EQ(ranges.largest(), 40u);
  ranges.Add(30, 30);
  EXPECT_EQ(ranges.largest(), 100u);
  EXPECT_FALSE(ranges.Take(101).has_value());
  EXPECT_FALSE(ranges.Take(0).has_value());
}

TEST(FreeRangesTest, TakesAnExactRangeOnlyWhenAllOfItIsFree) {
  FreeRanges ranges;
  ranges.Add(0, 100);
  EXPECT_TRUE(ranges.TakeAt(40, 20));  // from the middle: two pieces stay
  EXPECT_EQ(ranges.free_bytes(), 80u);
  EXPECT_EQ(ranges.largest(), 40u);
  EXPECT_FALSE(ranges.TakeAt(40, 20)) << "taken already";
  EXPECT_FALSE(ranges.TakeAt(30, 20)) << "half of it is taken";
  EXPECT_FALSE(ranges.TakeAt(50, 20)) << "half of it is taken";
  EXPECT_FALSE(ranges.TakeAt(90, 20)) << "past the end";
  EXPECT_FALSE(ranges.TakeAt(~0ull - 5, 10)) << "wraps";
  EXPECT_FALSE(ranges.TakeAt(0, 0));
  EXPECT_TRUE(ranges.TakeAt(0, 40));  // a whole piece
  EXPECT_TRUE(ranges.TakeAt(80, 20));  // the end of a piece
  EXPECT_EQ(ranges.free_bytes(), 20u);
  EXPECT_EQ(ranges.Take(20), 60u);
  ranges.Add(0, 100);
  EXPECT_EQ(ranges.largest(), 100u) << "everything came back and coalesced";
}

}  // namespace
}  // namespace tierd
