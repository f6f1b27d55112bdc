// The precompiled header of tierd's libraries (CMakeLists.txt, tierd_precompile_headers): the
// standard library and Abseil headers most of their files include, parsed once per library rather
// than once per file. None of tierd's own headers: a change to one would rebuild every file.
#ifndef TIERD_CMAKE_PCH_LIBRARIES_H_
#define TIERD_CMAKE_PCH_LIBRARIES_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#endif  // TIERD_CMAKE_PCH_LIBRARIES_H_
