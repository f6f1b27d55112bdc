// The precompiled header of the tests' code (tests/CMakeLists.txt): libraries nearly every test
// file includes, none of tierd's own headers (a change to one would rebuild every test).
#ifndef TIERD_TESTS_TEST_PCH_H_
#define TIERD_TESTS_TEST_PCH_H_

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#endif  // TIERD_TESTS_TEST_PCH_H_
