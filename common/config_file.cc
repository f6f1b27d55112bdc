#include "common/config_file.h"

#include <fcntl.h>

#include <cerrno>
#include <map>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/command_line.h"
#include "common/fd_io.h"
#include "common/posix_error.h"
#include "common/status_macros.h"

namespace tierd {
namespace {

// Far more than any real configuration; what a path like /dev/zero is cut off at.
constexpr size_t kMaxConfigFileBytes = 1 << 20;
constexpr size_t kMaxConfigLineBytes = 4096;

struct Setting {
  int line = 0;
  std::string key;  // as written
  std::string value;
  absl::CommandLineFlag* flag = nullptr;
};

// The value part of a line: up to a " #" comment, blanks trimmed, one pair of quotes removed.
absl::StatusOr<std::string> ParseValue(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::StartsWith(text, "\"")) {
    const size_t close = text.find('"', 1);
    if (close == absl::string_view::npos) return absl::InvalidArgumentError("unterminated quote");
    absl::string_view rest = absl::StripLeadingAsciiWhitespace(text.substr(close + 1));
    if (!rest.empty() && rest[0] != '#') {
      return absl::InvalidArgumentError("text after the closing quote");
    }
    return std::string(text.substr(1, close - 1));
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '#' && i > 0 && absl::ascii_isblank(text[i - 1])) {
      text = absl::StripTrailingAsciiWhitespace(text.substr(0, i));
      break;
    }
  }
  return std::string(text);
}

}  // namespace

absl::Status ApplyConfigFile(const std::string& path, absl::string_view flags_file,
                             absl::string_view config_flag) {
  // Read whole, bounded: a path such as /dev/zero must not make the daemon grow without end.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return PosixError(absl::StrCat("opening --", config_flag, " file ", path), errno);
  }
  std::string contents(kMaxConfigFileBytes + 1, '\0');
  ASSIGN_OR_RETURN(const size_t got, ReadUpTo(fd.get(), contents.data(), contents.size(), path));
  if (got > kMaxConfigFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a configuration file is at most ", kMaxConfigFileBytes, " bytes"));
  }
  contents.resize(got);
  std::vector<Setting> settings;
  std::map<std::string, int> first_line;  // flag name -> line
  int number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++number;
    const auto error = [&](absl::string_view message) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", message));
    };
    if (line.size() > kMaxConfigLineBytes) {
      return error(absl::StrCat("the line is longer than ", kMaxConfigLineBytes, " bytes"));
    }
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    const size_t equals = text.find('=');
    if (equals == absl::string_view::npos) return error("expected KEY = VALUE");
    Setting setting;
    setting.line = number;
    setting.key = std::string(absl::StripAsciiWhitespace(text.substr(0, equals)));
    if (setting.key.empty()) return error("expected KEY = VALUE");
    const std::string name = absl::StrReplaceAll(setting.key, {{"-", "_"}});
    absl::StatusOr<std::string> value = ParseValue(text.substr(equals + 1));
    if (!value.ok()) return error(absl::StrCat(setting.key, ": ", value.status().message()));
    setting.value = *std::move(value);
    if (name == config_flag) return error(absl::StrCat(setting.key, " cannot be set in a file"));
    setting.flag = absl::FindCommandLineFlag(name);
    if (setting.flag == nullptr || setting.flag->Filename() != flags_file) {
      return error(absl::StrCat("unknown key \"", setting.key,
                                "\" (keys are flags without their dashes, e.g. host-cache-bytes)"));
    }
    if (auto [it, inserted] = first_line.emplace(name, number); !inserted) {
      return error(absl::StrCat(setting.key, " is set twice (first on line ", it->second, ")"));
    }
    settings.push_back(std::move(setting));
  }
  // Every value is checked before any is set, so a bad file changes nothing.
  std::vector<FlagSetting> flag_settings;
  for (const Setting& setting : settings) {
    flag_settings.push_back(
        {setting.flag, setting.value,
         absl::StrCat(path, ":", setting.line, ": ", setting.key, " = \"", setting.value, "\"")});
  }
  return SetFlagsAllOrNone(flag_settings);
}

std::optional<std::string> FindFlagOnCommandLine(int argc, char** argv, absl::string_view name) {
  std::optional<std::string> value;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    if (!absl::ConsumePrefix(&arg, name)) continue;
    if (absl::ConsumePrefix(&arg, "=")) {
      value = std::string(arg);
    } else if (arg.empty() && i + 1 < argc) {
      value = argv[++i];
    }
  }
  return value;
}

}  // namespace tierd
