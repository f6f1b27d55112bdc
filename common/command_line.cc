#include "common/command_line.h"

#include "absl/flags/parse.h"

namespace tierd {

std::vector<std::string> ParseCommandLineWithDashes(int argc, char** argv) {
  std::vector<std::string> normalized(argv, argv + argc);
  for (size_t i = 1; i < normalized.size(); ++i) {
    std::string& arg = normalized[i];
    if (arg == "--") break;
    if (arg.size() < 3 || arg[0] != '-') continue;
    const size_t name_start = arg[1] == '-' ? 2 : 1;
    const size_t name_end = std::min(arg.find('='), arg.size());
    for (size_t c = name_start; c < name_end; ++c) {
      if (arg[c] == '-') arg[c] = '_';
    }
  }
  std::vector<char*> pointers;
  for (std::string& arg : normalized) pointers.push_back(arg.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace tierd
