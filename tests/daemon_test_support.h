// Helpers for tests that run tierd as a separate process and talk to it through the C++ client.
#ifndef TIERD_TESTS_DAEMON_TEST_SUPPORT_H_
#define TIERD_TESTS_DAEMON_TEST_SUPPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/tierd_client.h"
#include "tests/test_support.h"

namespace tierd::testing {

// Starts tierd with `argv` and waits until the health check on `socket_path` says SERVING.
// DEADLINE_EXCEEDED (the daemon is killed) when it does not within `timeout`.
absl::StatusOr<std::unique_ptr<Subprocess>> StartServingDaemon(const std::vector<std::string>& argv,
                                                               const std::string& socket_path,
                                                               absl::Duration timeout);

// Runs tierctl (a sibling binary) against the daemon at `socket_path` with `args`: its exit code
// and stdout, with its stderr too when `with_stderr`.
absl::StatusOr<RunResult> RunTierctl(const std::string& socket_path,
                                     const std::vector<std::string>& args, absl::Duration timeout,
                                     bool with_stderr = false);

// Stores `bytes` as `key` through `session` with `request`'s flags (its key and data are set here)
// and waits for the commit.
absl::Status StoreBytes(Session& session, const std::string& key, const std::string& bytes,
                        StoreRequest request = {});

// A stream socket connected to the Unix socket at `path` (a failure is a test failure); the caller
// closes it.
int ConnectUnix(const std::string& path);

// The bytes of `key` as a fetch through `session` hands them out; the lease is released.
absl::StatusOr<std::string> FetchBytes(Session& session, const std::string& key);

// Session::Evict, asked again while it is refused (FAILED_PRECONDITION) for a lease whose release
// has not reached the daemon yet or a copy whose completion has not been seen, for up to 30 s.
absl::StatusOr<v1::EvictResponse> EvictOnceFree(Session& session, const std::string& key,
                                                v1::Tier tier);

// The bytes `lease` holds, copied to the host through the session's stream (staging is device
// memory on CUDA). A failed copy is a test failure.
std::string LeaseBytes(Session& session, const Lease& lease);

// A connection to the session socket at `session_socket_path` that has greeted and opened a
// session named `client_name` (failures are test failures); the caller closes it.
int OpenSessionSocketSession(const std::string& session_socket_path,
                             const std::string& client_name);

// Session requests built as a client sends them, for tests that speak the wire themselves.
v1::SessionRequest OpenRequest(uint64_t id, const std::string& client_name);
v1::SessionRequest FetchRequestFor(uint64_t id, const std::string& key);
v1::SessionRequest PinRequestFor(uint64_t id, const std::string& key);
v1::SessionRequest PrefetchRequestFor(uint64_t id, const std::string& key);

}  // namespace tierd::testing

#endif  // TIERD_TESTS_DAEMON_TEST_SUPPORT_H_
