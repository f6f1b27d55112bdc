// SessionCore, the client's side of a session, over transports of the test's: what it does when
// the daemon at the other end hangs, and how its owner ends it.
#include "wire/session_core.h"

#include <memory>
#include <thread>

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

// A daemon that ends the session once the client has closed its writes, answering nothing.
class ClosingTransport : public SessionTransport {
 public:
  bool Write(const v1::SessionRequest&) override { return true; }
  bool Read(v1::SessionResponse&) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&closed_));
    return false;
  }
  void CloseWrites() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  void Abort() override { CloseWrites(); }
  absl::Status Finish() override { return absl::OkStatus(); }
  const char* kind() const override { return "closing"; }

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// Close ends the session and joins its reader on the owner's thread: every call fails afterwards,
// a second Close does nothing, and the last reference may then go on any thread (a peer's session
// held by a handler of its late answer once dropped it on its own reader, which joined itself).
TEST(SessionCoreTest, ASessionClosedByItsOwnerMayBeLetGoOnAnyThread) {
  std::shared_ptr<SessionCore> core = SessionCore::Start(std::make_unique<ClosingTransport>());
  core->Close();
  EXPECT_TRUE(core->ended());
  EXPECT_THAT(core->Call(testing::FetchRequestFor(1, "m/x")),
              StatusIs(absl::StatusCode::kUnavailable));
  const absl::Time start = absl::Now();
  core->Close();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  std::thread elsewhere([last = std::move(core)]() mutable { last.reset(); });
  elsewhere.join();
}

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
