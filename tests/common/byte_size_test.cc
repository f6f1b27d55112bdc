#include "common/byte_size.h"

#include "gtest/gtest.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::StatusIs;

TEST(ByteSizeTest, ParsesPlainNumbersAndBinaryUnits) {
  EXPECT_THAT(ParseByteSize("4096"), IsOkAndHolds(4096u));
  EXPECT_THAT(ParseByteSize("0"), IsOkAndHolds(0u));
  EXPECT_THAT(ParseByteSize("12B"), IsOkAndHolds(12u));
  EXPECT_THAT(ParseByteSize("4K"), IsOkAndHolds(4096u));
  EXPECT_THAT(ParseByteSize("512MiB"), IsOkAndHolds(512ull << 20));
  EXPECT_THAT(ParseByteSize("64G"), IsOkAndHolds(64ull << 30));
  EXPECT_THAT(ParseByteSize("64gb"), IsOkAndHolds(64ull << 30));
  EXPECT_THAT(ParseByteSize("1.5GiB"), IsOkAndHolds(3ull << 29));
  EXPECT_THAT(ParseByteSize(" 2 TiB "), IsOkAndHolds(2ull << 40));
}

TEST(ByteSizeTest, RejectsGarbageAndOverflow) {
  for (const char* bad : {"", "G", "12X", "-5", "1.2.3M", "5 KiBs", "3Bi", "99999999999999999999",
                          "16777216T", "1e3"}) {
    EXPECT_THAT(ParseByteSize(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(ByteSizeTest, FormatsWithTheLargestFittingUnit) {
  EXPECT_EQ(FormatByteSize(0), "0 B");
  EXPECT_EQ(FormatByteSize(1023), "1023 B");
  EXPECT_EQ(FormatByteSize(1536), "1.5 KiB");
  EXPECT_EQ(FormatByteSize(64ull << 30), "64 GiB");
  EXPECT_EQ(FormatByteSize(16384ull << 40), "16384 TiB");
}

}  // namespace
}  // namespace tierd
