#include "common/version.h"

namespace tierd {

// TIERD_VERSION is defined for this file alone (common/CMakeLists.txt), so that a new version
// rebuilds one file.
absl::string_view Version() { return TIERD_VERSION; }

}  // namespace tierd
