// The command-line parser tierd and tierctl share (common/command_line.h), on flags of its own.
#include "common/command_line.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"

ABSL_FLAG(int, test_count, 1, "an integer");
ABSL_FLAG(std::string, test_name, "default", "a string");
ABSL_FLAG(bool, test_switch, false, "a boolean");
ABSL_FLAG(bool, test_enabled, true, "a boolean that is on unless turned off");

namespace tierd {
namespace {

using ::testing::HasSubstr;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::StatusIs;

using Args = std::vector<std::string>;

class CommandLineTest : public ::testing::Test {
 protected:
  // Parses `args` (argv[0] is added) as a program whose flags are this file's, with -n for
  // --test-name.
  absl::StatusOr<std::vector<std::string>> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "program");
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    return ParseFlagsAndArguments(static_cast<int>(argv.size()), argv.data(),
                                  {__FILE__, {{"n", "test_name"}}});
  }

  // Every flag gets its value back after each test.
  absl::FlagSaver saver_;
};

TEST_F(CommandLineTest, TakesValuesAfterEqualsOrInTheNextArgumentWithDashesOrUnderscores) {
  EXPECT_THAT(Parse({"--test-count=7", "-test_name", "x y", "serve"}),
              IsOkAndHolds(Args{"program", "serve"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "x y");
  // A negative number and "-" are values, not flags.
  EXPECT_THAT(Parse({"--test_count", "-3", "--test-name", "-"}), IsOkAndHolds(Args{"program"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), -3);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "-");
  // An empty value is a value.
  EXPECT_THAT(Parse({"--test-name="}), IsOkAndHolds(Args{"program"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "");
}

TEST_F(CommandLineTest, BooleansTakeNoSeparateValueAndNoPrefixTurnsThemOff) {
  EXPECT_THAT(Parse({"--test-switch", "false", "--notest-enabled"}),
              IsOkAndHolds(Args{"program", "false"}));
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_switch));
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_enabled));
  EXPECT_THAT(Parse({"--test-switch=false", "--test_enabled=true"}), IsOkAndHolds(Args{"program"}));
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_switch));
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_enabled));
}

TEST_F(CommandLineTest, PositionalArgumentsGoBetweenFlagsAndEverythingAfterDoubleDash) {
  EXPECT_THAT(Parse({"get", "-", "--test-count=2", "key", "--", "--test-count=3", "-n"}),
              IsOkAndHolds(Args{"program", "get", "-", "key", "--test-count=3", "-n"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 2);
}

TEST_F(CommandLineTest, OneLetterAliasesTakeTheirValueEitherWay) {
  EXPECT_THAT(Parse({"-n", "file"}), IsOkAndHolds(Args{"program"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "file");
  EXPECT_THAT(Parse({"-n=other"}), IsOkAndHolds(Args{"program"}));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "other");
  // Only with one dash.
  EXPECT_THAT(Parse({"--n=file"}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CommandLineTest, ErrorsNameTheFlagAsWrittenAndItsValue) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--no-such-flag=1"}, "unknown flag --no-such-flag"},
      {{"--notest-count"}, "unknown flag --notest-count"},  // not a boolean
      {{"--test-count=abc"}, "--test-count=abc: "},
      {{"--test-switch=maybe"}, "--test-switch=maybe: "},
      {{"--notest-switch=false"}, "--notest-switch takes no value"},
      {{"--test-count"}, "--test-count needs a value"},
      {{"-n", "--test-count=2"}, "-n needs a value"},
      {{"--test-count=1", "--test_count", "2"},
       "--test_count is given twice (also as --test-count)"},
      {{"-n", "a", "--test-name=b"}, "--test-name is given twice (also as -n)"},
      {{"--test-switch", "--notest-switch"}, "--notest-switch is given twice"},
      // absl's own flags, and any flag another file defines, are not the program's to take.
      {{"--flagfile=/dev/null"}, "--flagfile is not one of this program's flags"},
      {{"--fromenv=test_count"}, "--fromenv is not one of this program's flags"},
  };
  for (const Case& bad : cases) {
    absl::StatusOr<std::vector<std::string>> parsed = Parse(bad.args);
    EXPECT_THAT(parsed, StatusIs(absl::StatusCode::kInvalidArgument)) << bad.args[0];
    EXPECT_THAT(parsed.status().message(), HasSubstr(bad.message)) << bad.args[0];
  }
}

TEST_F(CommandLineTest, NothingIsSetWhenAnyFlagIsRefused) {
  EXPECT_THAT(Parse({"--test-count=5", "--test-name=set", "--test-switch=maybe"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 1);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "default");
  EXPECT_THAT(Parse({"--test-count=5", "--no-such-flag"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 1);
}

TEST_F(CommandLineTest, SetFlagsAllOrNoneRestoresEveryValueWhenOneIsRefused) {
  absl::CommandLineFlag* count = absl::FindCommandLineFlag("test_count");
  absl::CommandLineFlag* name = absl::FindCommandLineFlag("test_name");
  ASSERT_NE(count, nullptr);
  ASSERT_NE(name, nullptr);
  absl::Status status = SetFlagsAllOrNone({{count, "2", "first"},
                                           {name, "n", "second"},
                                           {count, "3", "third"},
                                           {count, "x", "fourth"}});
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(status.message(), HasSubstr("fourth: "));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 1);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "default");
}

TEST_F(CommandLineTest, HelpIsHandedToAbslEvenBesideABadFlag) {
  // absl prints the usage on stdout and exits 1 for --help.
  EXPECT_EXIT((void)Parse({"--no-such-flag", "--help"}), ::testing::ExitedWithCode(1), "");
}

}  // namespace
}  // namespace tierd
