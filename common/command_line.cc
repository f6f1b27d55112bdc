#include "common/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "common/version.h"

namespace tierd {
namespace {

// absl's usage flags: absl prints what they ask for and exits.
constexpr absl::string_view kHelpFlags[] = {"help",   "helpfull",  "helpshort", "helppackage",
                                            "helpon", "helpmatch", "version"};

bool IsHelpFlag(absl::string_view name) {
  return std::find(std::begin(kHelpFlags), std::end(kHelpFlags), name) != std::end(kHelpFlags);
}

std::string Underscored(absl::string_view name) { return absl::StrReplaceAll(name, {{"-", "_"}}); }

// One flag argument split up: "--state-dir=/x" is {"--", "state-dir", "/x"}.
struct FlagArgument {
  absl::string_view dashes;  // "-" or "--"
  absl::string_view name;    // as written
  std::optional<std::string> value;
};

// Nullopt for a positional argument: no leading dash, "-" alone.
std::optional<FlagArgument> SplitFlagArgument(absl::string_view arg) {
  if (arg.size() < 2 || arg[0] != '-') return std::nullopt;
  FlagArgument flag;
  flag.dashes = arg.substr(0, arg[1] == '-' ? 2 : 1);
  absl::string_view body = arg.substr(flag.dashes.size());
  const size_t equals = body.find('=');
  flag.name = body.substr(0, equals);
  if (equals != absl::string_view::npos) flag.value = std::string(body.substr(equals + 1));
  return flag;
}

// Hands a help flag to absl, which prints the usage and exits; --version prints
// "PROGRAM VERSION" here.
[[noreturn]] void ShowHelp(char* program, const FlagArgument& help) {
  if (Underscored(help.name) == "version") {
    const char* slash = std::strrchr(program, '/');
    std::printf("%s %s\n", slash == nullptr ? program : slash + 1, std::string(Version()).c_str());
    std::exit(0);
  }
  std::string arg = absl::StrCat("--", Underscored(help.name));
  if (help.value.has_value()) absl::StrAppend(&arg, "=", *help.value);
  char* args[] = {program, arg.data()};
  absl::ParseCommandLine(2, args);
  // absl exits after printing; should it ever return, the program was asked for nothing else.
  std::exit(0);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseFlagsAndArguments(int argc, char** argv,
                                                                const CommandLineSpec& spec) {
  // Help first, so that a bad flag beside it does not hide the usage.
  for (int i = 1; i < argc; ++i) {
    if (absl::string_view(argv[i]) == "--") break;
    std::optional<FlagArgument> flag = SplitFlagArgument(argv[i]);
    if (flag.has_value() && IsHelpFlag(Underscored(flag->name))) ShowHelp(argv[0], *flag);
  }

  std::vector<std::string> positional;
  if (argc > 0) positional.emplace_back(argv[0]);
  std::vector<FlagSetting> settings;
  std::map<const absl::CommandLineFlag*, std::string> given;  // -> as first written
  for (int i = 1; i < argc; ++i) {
    if (absl::string_view(argv[i]) == "--") {
      positional.insert(positional.end(), argv + i + 1, argv + argc);
      break;
    }
    std::optional<FlagArgument> argument = SplitFlagArgument(argv[i]);
    if (!argument.has_value()) {
      positional.emplace_back(argv[i]);
      continue;
    }
    const std::string written = absl::StrCat(argument->dashes, argument->name);
    std::string name = Underscored(argument->name);
    if (argument->dashes == "-") {
      if (auto alias = spec.short_names.find(name); alias != spec.short_names.end()) {
        name = alias->second;
      }
    }
    absl::CommandLineFlag* flag = name.empty() ? nullptr : absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* positive = absl::FindCommandLineFlag(name.substr(2));
      if (positive != nullptr && positive->IsOfType<bool>()) {
        flag = positive;
        negated = true;
      }
    }
    if (flag == nullptr || flag->IsRetired()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", written));
    }
    if (flag->Filename() != spec.flags_file) {
      return absl::InvalidArgumentError(
          absl::StrCat(written, " is not one of this program's flags"));
    }
    std::string value;
    if (negated) {
      if (argument->value.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(written, " takes no value"));
      }
      value = "false";
    } else if (argument->value.has_value()) {
      value = *std::move(argument->value);
    } else if (flag->IsOfType<bool>()) {
      value = "true";
    } else if (i + 1 < argc && !absl::StartsWith(argv[i + 1], "--")) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(written, " needs a value"));
    }
    if (auto [first, inserted] = given.emplace(flag, written); !inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          written, " is given twice",
          first->second == written ? "" : absl::StrCat(" (also as ", first->second, ")")));
    }
    settings.push_back({flag, value, absl::StrCat(written, "=", value)});
  }
  RETURN_IF_ERROR(SetFlagsAllOrNone(settings));
  return positional;
}

absl::Status SetFlagsAllOrNone(const std::vector<FlagSetting>& settings) {
  std::vector<std::pair<absl::CommandLineFlag*, std::string>> previous;
  for (const FlagSetting& setting : settings) {
    previous.emplace_back(setting.flag, setting.flag->CurrentValue());
    std::string error;
    if (setting.flag->ParseFrom(setting.value, &error)) continue;
    // Last set, first restored: a flag set twice ends with the value it had before either.
    for (auto it = previous.rbegin(); it != previous.rend(); ++it) {
      std::string ignored;
      it->first->ParseFrom(it->second, &ignored);
    }
    return absl::InvalidArgumentError(absl::StrCat(setting.label, ": ", error));
  }
  return absl::OkStatus();
}

}  // namespace tierd
