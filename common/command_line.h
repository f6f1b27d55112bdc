// Command-line parsing shared by tierd and tierctl, on absl flags but without absl's parser: that
// one exits with status 1 on a bad flag, while both programs promise 2 for bad usage
// (docs/CONFIGURATION.md and docs/CLIENTS.md, and the systemd unit's RestartPreventExitStatus=2).
// Errors come back as a Status instead, and the program exits 2 with the message.
//
// Accepted, as absl accepts them:
//   --name=VALUE, -name=VALUE, and --name VALUE (the next argument is the value, unless it starts
//     with "--": "-o -" and "--shutdown-grace-ms -5" take "-" and "-5");
//   --boolflag, --noboolflag, --boolflag=true|false (a boolean never takes the next argument);
//   dashes or underscores inside a name (--state-dir, --state_dir);
//   positional arguments between flags; "-" alone is positional, and so is everything after "--".
// Beyond absl: one-letter aliases (tierctl's -o FILE), and refusals of a flag given twice and of
// flags the program does not define itself (absl's --flagfile, --fromenv, ... and flags of linked
// libraries). The help flags (--help, --helpfull, --helpshort, --helppackage, --helpon=,
// --helpmatch=, --version) are handed to absl, which prints and exits.
#ifndef TIERD_COMMON_COMMAND_LINE_H_
#define TIERD_COMMON_COMMAND_LINE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

struct CommandLineSpec {
  // Only flags defined in this source file may be set: the program's own, named by the __FILE__ of
  // the file holding its ABSL_FLAGs.
  std::string flags_file;
  // One-letter aliases, spelled with one dash: {{"o", "output"}} makes "-o FILE" and "-o=FILE"
  // mean "--output=FILE".
  std::map<std::string, std::string> short_names;
};

// Sets the flags given in argv[1..argc) and returns the positional arguments, argv[0] first.
// Nothing is set unless every flag and value is valid. A help flag exits the process (absl prints
// the usage) without returning.
// Errors: INVALID_ARGUMENT naming the flag as written, and its value where it has one: an unknown
// flag, a flag the program does not define, a flag given twice, a missing value, a value for
// --noflag, or a value the flag does not take.
absl::StatusOr<std::vector<std::string>> ParseFlagsAndArguments(int argc, char** argv,
                                                                const CommandLineSpec& spec);

// A new value for a flag, and how an error names it (e.g. `--v=abc`, or `tierd.conf:3: v = "abc"`).
struct FlagSetting {
  absl::CommandLineFlag* flag = nullptr;
  std::string value;
  std::string label;
};

// Sets the flags in order or, when one refuses its value, none: those already set get their
// previous values back. Errors: INVALID_ARGUMENT "LABEL: why the value is refused".
absl::Status SetFlagsAllOrNone(const std::vector<FlagSetting>& settings);

}  // namespace tierd

#endif  // TIERD_COMMON_COMMAND_LINE_H_
