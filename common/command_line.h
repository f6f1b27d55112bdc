// Command-line parsing shared by tierd and tierctl: absl flags, with the dashed spelling people
// type
// (--state-dir) accepted for absl's underscored names (--state_dir).
#ifndef TIERD_COMMON_COMMAND_LINE_H_
#define TIERD_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

namespace tierd {

// Parses flags (exiting with a message on a bad one, as absl does) and returns the positional
// arguments, argv[0] first. Dashes inside a flag's name become underscores; values are untouched;
// everything after a bare "--" is positional.
std::vector<std::string> ParseCommandLineWithDashes(int argc, char** argv);

}  // namespace tierd

#endif  // TIERD_COMMON_COMMAND_LINE_H_
