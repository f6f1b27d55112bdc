// Fuzzes request validation: the input is parsed as serialized tierd.v1 messages, as a hostile
// client could send them, and handed to what checks them before anything else runs: a
// SessionRequest to an open session, and PrefetchRequest / EvictRequest to the unary calls' shared
// code (RunPrefetch, RunEvict). Anything may be refused; nothing may crash, hang, or leave a
// lease, reservation or pin behind once the session is closed.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_stack.h"
#include "wire/wire_format.h"

namespace tierd::fuzzing {
namespace {

int Run(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  FuzzStack& stack = FuzzStack::Get();
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      v1::PrefetchRequest prefetch;
      if (prefetch.ParseFromString(bytes)) {
        (void)RunPrefetch(*stack.tier, prefetch, stack.session_options.max_key_bytes, "prefetch");
      }
      return 0;
    }
    case 1: {
      v1::EvictRequest evict;
      if (evict.ParseFromString(bytes)) {
        (void)RunEvict(*stack.tier, evict, stack.session_options.max_key_bytes, "evict");
      }
      return 0;
    }
    default:
      break;
  }
  v1::SessionRequest request;
  if (!request.ParseFromString(bytes)) return 0;
  absl::Mutex mu;
  int answers = 0;
  auto session = std::make_shared<SessionProtocol>(*stack.tier, stack.session_options,
                                                   [&](v1::SessionResponse) {
                                                     absl::MutexLock lock(&mu);
                                                     ++answers;
                                                   });
  v1::SessionRequest open;
  open.set_request_id(1);
  open.mutable_open()->set_client_name("fuzz");
  open.mutable_open()->set_protocol(SessionProtocolVersion());
  session->Handle(open);
  session->Handle(request);
  {
    // The open and the request are both answered (a quiet release that succeeded is not).
    const bool quiet = request.has_release() && request.release().quiet();
    absl::MutexLock lock(&mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return answers >= (quiet ? 1 : 2); };
    if (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10))) {
      std::fprintf(stderr, "session_request_fuzzer: no answer in 10 s\n");
      std::abort();
    }
  }
  session->Close();
  stack.ExpectNothingHeld();
  return 0;
}

}  // namespace
}  // namespace tierd::fuzzing

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return tierd::fuzzing::Run(data, size);
}
