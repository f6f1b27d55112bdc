// How tierctl shows what the daemon sends (client/tierctl_format.h).
#include "client/tierctl_format.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tierd {
namespace {

using ::testing::HasSubstr;

TEST(TierctlFormatTest, EscapeForTextEscapesControlCharactersAsJsonDoes) {
  EXPECT_EQ(EscapeForText("m/blocks.3"), "m/blocks.3");
  EXPECT_EQ(EscapeForText(std::string("a\0b", 3)), "a\\u0000b");
  EXPECT_EQ(EscapeForText("tab\there\nnew\rline\b\f"), "tab\\there\\nnew\\rline\\b\\f");
  EXPECT_EQ(EscapeForText("\x1b[2J\x7f"), "\\u001b[2J\\u007f");
  // A backslash is escaped too, so an escape in the output always means a character.
  EXPECT_EQ(EscapeForText("a\\u0000b"), "a\\\\u0000b");
}

TEST(TierctlFormatTest, EscapeForTextKeepsUtf8AndMarksWhatIsNot) {
  EXPECT_EQ(EscapeForText("blocks.3 → gpu, μ, 🙂"), "blocks.3 → gpu, μ, 🙂");
  // C1 controls (U+009B is a CSI) are escaped like C0.
  EXPECT_EQ(EscapeForText("\xc2\x9b"
                          "2J"),
            "\\u009b2J");
  // A lone continuation byte, a truncated sequence, an overlong NUL, a surrogate.
  EXPECT_EQ(EscapeForText("\x80"), "\\x80");
  EXPECT_EQ(EscapeForText("\xe2\x86"), "\\xe2\\x86");
  EXPECT_EQ(EscapeForText("\xc0\x80"), "\\xc0\\x80");
  EXPECT_EQ(EscapeForText("\xed\xa0\x80"), "\\xed\\xa0\\x80");
}

TEST(TierctlFormatTest, ObjectTablesShowEveryKeyWhole) {
  v1::ObjectInfo hidden;
  hidden.set_key(std::string("m/w\0hidden", 10));
  hidden.set_size(16);
  v1::ObjectInfo plain;
  plain.set_key("m/blocks.0");
  plain.set_size(16);
  const std::string table = FormatObjects({hidden, plain});
  EXPECT_EQ(table.find('\0'), std::string::npos);
  EXPECT_THAT(table, HasSubstr("m/w\\u0000hidden  "));
  EXPECT_THAT(table, HasSubstr("m/blocks.0"));
  EXPECT_THAT(table, HasSubstr("2 objects"));

  EXPECT_THAT(table, ::testing::Not(HasSubstr("HOME")));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("compressed")));

  // In host memory: one raw, one compressed to 0.70 of its size.
  v1::ObjectInfo raw_held;
  raw_held.set_key("m/blocks.1");
  raw_held.set_size(1 << 20);
  raw_held.set_in_host_cache(true);
  raw_held.set_host_bytes(1 << 20);
  v1::ObjectInfo compressed;
  compressed.set_key("m/blocks.2");
  compressed.set_size(10 << 20);
  compressed.set_in_host_cache(true);
  compressed.set_host_bytes(7 << 20);
  const std::string held = FormatObjects({plain, raw_held, compressed});
  EXPECT_THAT(held, HasSubstr("IN HOST MEMORY"));
  EXPECT_THAT(held, HasSubstr("7 MiB (0.70)"));
  EXPECT_THAT(held, ::testing::Not(HasSubstr("1 MiB (")));
  EXPECT_THAT(held, HasSubstr("2 in this daemon's host memory, compressed to 8 MiB from 11 MiB"));

  // On a node, each object's home daemon.
  hidden.set_home("/run/tierd/gpu1.sock");
  plain.set_home("/run/tierd/gpu0.sock");
  const std::string homed = FormatObjects({hidden, plain});
  EXPECT_THAT(homed, HasSubstr("HOME"));
  EXPECT_THAT(homed, HasSubstr("/run/tierd/gpu1.sock"));

  v1::ModelSummary model;
  model.set_name("m\x1b]0;title\x07");
  EXPECT_THAT(FormatModels({model}), HasSubstr("m\\u001b]0;title\\u0007 "));
}

}  // namespace
}  // namespace tierd
