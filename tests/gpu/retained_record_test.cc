// The record of retained sets: written and read back; read as untrusted input.
#include "gpu/detail/retained_record.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"

namespace tierd {
namespace {

bool AnyTarget(const std::string& target) { return !target.empty(); }

TEST(RetainedRecordTest, WhatIsWrittenIsReadBack) {
  testing::TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/retained.sets");
  EXPECT_TRUE(ReadRetainedRecord(path, absl::Hours(1), 10, AnyTarget).empty()) << "no file yet";
  ASSERT_TRUE(WriteRetainedRecord(path, {{absl::Seconds(90), false, 3, "m"},
                                         {absl::ZeroDuration(), true, 1, "kv/with space"}})
                  .ok());
  const std::vector<RecordedSet> read = ReadRetainedRecord(path, absl::Hours(1), 10, AnyTarget);
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].ttl, absl::Seconds(90));
  EXPECT_FALSE(read[0].asleep);
  EXPECT_EQ(read[0].objects, 3u);
  EXPECT_EQ(read[0].target, "m");
  EXPECT_TRUE(read[1].asleep);
  EXPECT_EQ(read[1].target, "kv/with space");
}

TEST(RetainedRecordTest, AtMostMaxSetsAreReadAndBadLinesAreSkipped) {
  testing::TempDir dir;
  const std::string path = absl::StrCat(dir.path(), "/retained.sets");
  std::string text = "tierd retained sets v1\n0\t0\t1\tfirst\n0\t1\t1\tfirst\n0\t0\t1\t\n"
                     "7200000\t0\t1\tover-the-ttl-limit\n";
  for (int i = 0; i < 10; ++i) absl::StrAppend(&text, "0\t0\t1\tset", i, "\n");
  ASSERT_TRUE(testing::WriteFile(path, text).ok());
  const std::vector<RecordedSet> read = ReadRetainedRecord(path, absl::Hours(1), 4, AnyTarget);
  ASSERT_EQ(read.size(), 4u);
  EXPECT_EQ(read[0].target, "first");
  EXPECT_FALSE(read[0].asleep) << "the first line of a target counts";
  EXPECT_EQ(read[1].target, "set0");
  EXPECT_EQ(read[3].target, "set2");
  ASSERT_TRUE(testing::WriteFile(path, "not a record\n0\t0\t1\tm\n").ok());
  EXPECT_TRUE(ReadRetainedRecord(path, absl::Hours(1), 4, AnyTarget).empty());
}

}  // namespace
}  // namespace tierd
