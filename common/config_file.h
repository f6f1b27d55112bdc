// Flags from a configuration file (tierd --config=/etc/tierd/tierd.conf): the same settings as the
// command line, one per line, so a node's settings live in one file and a unit or pod only adds
// what differs per GPU. Flags given on the command line win over the file.
//
//   # /etc/tierd/tierd.conf
//   host-cache-bytes = 64GiB
//   host_cache_policy = lru      # dashes or underscores, as on the command line
//   session-socket = ""          # quotes keep an empty value or surrounding spaces
//
// A line is blank, a comment (its first non-blank character is '#'), or `KEY = VALUE`, where KEY is
// a flag's name without its dashes. VALUE runs to the end of the line, or to a '#' after a space;
// surrounding blanks are dropped.
#ifndef TIERD_COMMON_CONFIG_FILE_H_
#define TIERD_COMMON_CONFIG_FILE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tierd {

// Sets the flags named in the file at `path`. Only flags defined in the source file `flags_file`
// (the program's own, by its __FILE__) may be set, and `config_flag` (the flag naming the file)
// may not. Nothing is set unless the whole file is valid.
// Errors: the file's open/read errors; INVALID_ARGUMENT for a file over 1 MiB (read no further:
// --config=/dev/zero costs nothing), and "PATH:LINE: ..." naming the bad key for an unknown or
// repeated key, a line over 4 KiB or that is not `KEY = VALUE`, or a value the flag does not take.
absl::Status ApplyConfigFile(const std::string& path, absl::string_view flags_file,
                             absl::string_view config_flag);

// The value of flag `name` on the command line (`--name=V`, `-name=V`, `--name V`), if given; the
// last one wins, as when the command line is parsed. Stops at a bare "--".
std::optional<std::string> FindFlagOnCommandLine(int argc, char** argv, absl::string_view name);

}  // namespace tierd

#endif  // TIERD_COMMON_CONFIG_FILE_H_
