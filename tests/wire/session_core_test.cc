// SessionCore, the client's side of a session, over a transport of the test's: what it does when
// the daemon at the other end hangs.
#include "wire/session_core.h"

#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/test_support.h"
#include "wire/session_transport.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

// A daemon that hangs: it takes requests and never answers, nor ends the session when asked to;
// only Abort ends it.
class HungTransport : public SessionTransport {
 public:
  bool Write(const v1::SessionRequest&) override { return true; }
  bool Read(v1::SessionResponse&) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&aborted_));
    return false;
  }
  void CloseWrites() override {}
  void Abort() override {
    absl::MutexLock lock(&mu_);
    aborted_ = true;
  }
  absl::Status Finish() override { return absl::UnavailableError("cut"); }
  const char* kind() const override { return "hung"; }

 private:
  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

// A session whose daemon hangs is ended all the same when it is destroyed: after a grace for the
// answers on their way, its connection is cut (a daemon stopping while a peer hung once waited
// for ever here).
TEST(SessionCoreTest, DestroyingASessionWhoseDaemonHangsTakesItsGraceNotForever) {
  std::shared_ptr<SessionCore> core = SessionCore::Start(std::make_unique<HungTransport>());
  absl::Status answer;
  ASSERT_THAT(
      core->Send(testing::FetchRequestFor(1, "m/x"),
                 [&answer](const v1::SessionResponse& response) { answer = StatusOf(response); }),
      IsOk());
  const absl::Time start = absl::Now();
  core.reset();
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, SessionCore::kCloseGrace - absl::Milliseconds(100));
  EXPECT_LT(took, SessionCore::kCloseGrace + absl::Seconds(3));
  EXPECT_THAT(answer, StatusIs(absl::StatusCode::kUnavailable));  // answered, not forgotten
}

}  // namespace
}  // namespace tierd
