// SessionProtocol in this process, on the host backend's tiers: driven directly, and through the
// wire (the session socket server and the client's SessionCore, or raw frames). A request is
// answered with what it asked for and the handles it needs; a frame that does not decode ends the
// session; a half-close still gets the answers in flight; and whatever way a session ends, what it
// held is released.
#include "server/session_protocol.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "device/handle_format.h"
#include "device/host_device.h"
#include "gpu/gpu_tier.h"
#include "gtest/gtest.h"
#include "server/session_socket_server.h"
#include "server/unread_answer_budget.h"
#include "storage/host/host_arena.h"
#include "storage/host/host_cache.h"
#include "storage/io/disk_reader.h"
#include "storage/io/spill_writer.h"
#include "storage/model/catalog.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"
#include "wire/session_core.h"
#include "wire/session_socket.h"
#include "wire/session_transport.h"
#include "wire/wire_format.h"

namespace tierd {
namespace {

using ::tierd::testing::FetchRequestFor;
using ::tierd::testing::IsOk;
using ::tierd::testing::OpenRequest;
using ::tierd::testing::PrefetchRequestFor;
using ::tierd::testing::StatusIs;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(10);

// Whether `holds()` becomes true within kTimeout.
template <typename Predicate>
bool Soon(Predicate holds) {
  const absl::Time deadline = absl::Now() + kTimeout;
  while (absl::Now() < deadline) {
    if (holds()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return holds();
}

// The answers one session was sent, by request id, in the order they came.
class Answers {
 public:
  void Add(v1::SessionResponse response) {
    absl::MutexLock lock(&mu_);
    order_.push_back(response.request_id());
    answers_[response.request_id()] = std::move(response);
  }
  // The answer to `id`; a test failure (and an empty answer) when none comes in time.
  v1::SessionResponse Await(uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto answered = [this, id]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answers_.count(id) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&answered), kTimeout)) {
      ADD_FAILURE() << "request " << id << " got no answer";
      return v1::SessionResponse();
    }
    return answers_.at(id);
  }
  std::vector<uint64_t> order() {
    absl::MutexLock lock(&mu_);
    return order_;
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, v1::SessionResponse> answers_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> order_ ABSL_GUARDED_BY(mu_);
};

class SessionProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Model "m": 4 blocks of one F32 tensor of 16 KiB.
    const std::string model_dir = absl::StrCat(dir_.path(), "/model");
    ASSERT_EQ(::mkdir(model_dir.c_str(), 0755), 0);
    for (int block = 0; block < 4; ++block) {
      tensors_.push_back(testing::RandomTensor(absl::StrCat("blocks.", block, ".w"), "F32",
                                               {64, 64}, 300 + block));
    }
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir, "/model.safetensors"), tensors_),
                IsOk());
    auto device = HostDevice::Create();
    ASSERT_THAT(device, IsOk());
    device_ = *std::move(device);
    auto catalog = Catalog::Open(absl::StrCat(dir_.path(), "/state"));
    ASSERT_THAT(catalog, IsOk());
    catalog_ = *std::move(catalog);
    ASSERT_THAT(catalog_->RegisterModel("m", model_dir, Grouping::kBlock, GroupingRules::Defaults(),
                                        nullptr),
                IsOk());
    auto arena = HostArena::Create(*device_, {1 << 20, 1 << 20});
    ASSERT_THAT(arena, IsOk());
    arena_ = *std::move(arena);
    DiskReaderOptions reader;
    reader.threads = 1;
    reader.queue_depth = 4;
    reader.chunk_bytes = 64 << 10;
    reader.direct = false;
    auto disk_reader = DiskReader::Create(reader);
    ASSERT_THAT(disk_reader, IsOk());
    reader_ = *std::move(disk_reader);
    auto spill = SpillWriter::Create(absl::StrCat(dir_.path(), "/spill"));
    ASSERT_THAT(spill, IsOk());
    spill_ = *std::move(spill);
    host_cache_ =
        std::make_unique<HostCache>(*catalog_, *reader_, *arena_, spill_.get(), HostCacheOptions{});
    GpuTierOptions gpu;
    gpu.pool_bytes = 256 << 10;
    gpu.slab_bytes = 128 << 10;
    gpu.close_grace = absl::Milliseconds(200);
    auto tier = GpuTier::Create(*device_, *catalog_, *arena_, *host_cache_, gpu);
    ASSERT_THAT(tier, IsOk());
    tier_ = *std::move(tier);
    options_.backend = device_->backend();
    options_.device = device_->Describe();
    options_.limits.max_leases = 8;
    options_.limits.max_staging_bytes = 256 << 10;
  }

  void TearDown() override {
    server_.reset();
    tier_.reset();
  }

  // A protocol whose answers go to `answers`.
  std::shared_ptr<SessionProtocol> NewProtocol(Answers& answers) {
    return std::make_shared<SessionProtocol>(
        *tier_, options_,
        [&answers](v1::SessionResponse response) { answers.Add(std::move(response)); });
  }

  // Serves sessions on a session socket in this process; returns its path.
  std::string StartServer() {
    const std::string path = absl::StrCat(dir_.path(), "/gpu0.session.sock");
    auto server =
        SessionSocketServer::Start(path, std::nullopt, *tier_, options_, serving_, budget_);
    EXPECT_THAT(server, IsOk());
    if (server.ok()) server_ = *std::move(server);
    return path;
  }

  // A client's session core on the session socket at `path` (its transport wrapped by `wrap` when
  // set), opened; null (and a test failure) when it cannot be.
  std::shared_ptr<SessionCore> OpenSessionCore(
      const std::string& path,
      std::function<std::unique_ptr<SessionTransport>(std::unique_ptr<SessionTransport>)> wrap =
          nullptr) {
    auto transport = ConnectSessionSocket(path, client_busy_poll_);
    EXPECT_THAT(transport, IsOk());
    if (!transport.ok()) return nullptr;
    std::shared_ptr<SessionCore> core =
        SessionCore::Start(wrap ? wrap(*std::move(transport)) : *std::move(transport));
    core->set_device(std::shared_ptr<Device>(std::shared_ptr<Device>(), device_.get()));
    absl::StatusOr<v1::SessionResponse> opened =
        core->Call(OpenRequest(0, "session_protocol_test"));
    EXPECT_THAT(opened, IsOk());
    if (!opened.ok()) return nullptr;
    const absl::Status taken = core->Opened(*opened);
    EXPECT_THAT(taken, IsOk());
    return taken.ok() ? core : nullptr;
  }

  // Whether the tier's stats satisfy `holds` within kTimeout.
  template <typename Predicate>
  bool StatsSoon(Predicate holds) {
    return Soon([&] { return holds(tier_->stats()); });
  }
  // Whether, within kTimeout, no session is open and nothing is leased, reserved or pinned.
  bool NothingHeldSoon() {
    return StatsSoon([](const GpuTierStats& stats) {
      return stats.clients == 0 && stats.leases == 0 && stats.reservations == 0 && stats.pins == 0;
    });
  }

  // The bytes the model file holds for block `block`'s tensor.
  const std::string& BlockBytes(int block) const { return tensors_[block].data; }

  // That `lease`, leased through `core`, holds block `block`'s bytes once its ready event is done.
  void ExpectLeaseHoldsBlock(SessionCore& core, const v1::Lease& lease, int block) {
    absl::StatusOr<Slab*> slab = core.slab(lease.slab_id());
    ASSERT_THAT(slab, IsOk());
    if (lease.has_ready_event_id()) {
      absl::StatusOr<Event*> ready = core.event(lease.ready_event_id());
      ASSERT_THAT(ready, IsOk());
      ASSERT_THAT(device_->SynchronizeEvent(**ready), IsOk());
    }
    ASSERT_EQ(lease.length(), BlockBytes(block).size());
    EXPECT_EQ(std::memcmp(static_cast<const char*>((*slab)->data()) + lease.offset(),
                          BlockBytes(block).data(), BlockBytes(block).size()),
              0);
  }

  TempDir dir_;
  std::vector<testing::TensorSpec> tensors_;
  std::unique_ptr<HostDevice> device_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<DiskReader> reader_;
  std::unique_ptr<SpillWriter> spill_;
  std::unique_ptr<HostCache> host_cache_;
  std::unique_ptr<GpuTier> tier_;
  SessionOptions options_;
  SessionSocketOptions serving_;                            // StartServer's
  absl::Duration client_busy_poll_ = absl::ZeroDuration();  // OpenSessionCore's
  UnreadAnswerBudget budget_{64 << 20};
  std::unique_ptr<SessionSocketServer> server_;
};

TEST_F(SessionProtocolTest, AFetchIsAnsweredWithItsLeaseAndEachHandleOnce) {
  Answers answers;
  auto protocol = NewProtocol(answers);
  protocol->Handle(OpenRequest(1, "session_protocol_test"));
  const v1::SessionResponse opened = answers.Await(1);
  ASSERT_EQ(opened.code(), 0) << opened.message();
  EXPECT_EQ(opened.opened().backend(), "host");
  // The session's done events come with their handles.
  EXPECT_EQ(opened.opened().done_event_ids_size(), 4);
  std::set<uint32_t> opened_events;
  for (const v1::Handle& handle : opened.new_handles()) {
    if (handle.kind() == v1::Handle::EVENT) opened_events.insert(handle.id());
  }
  for (uint32_t id : opened.opened().done_event_ids()) EXPECT_EQ(opened_events.count(id), 1u);

  protocol->Handle(FetchRequestFor(2, "m/blocks.1"));
  const v1::SessionResponse first = answers.Await(2);
  ASSERT_EQ(first.code(), 0) << first.message();
  ASSERT_TRUE(first.has_lease());
  EXPECT_EQ(first.lease().key(), "m/blocks.1");
  EXPECT_EQ(first.lease().length(), BlockBytes(1).size());
  std::map<uint32_t, std::string> slabs;
  std::map<uint32_t, std::string> events;
  for (const v1::Handle& handle : first.new_handles()) {
    (handle.kind() == v1::Handle::SLAB ? slabs : events)[handle.id()] = handle.handle();
    if (handle.kind() == v1::Handle::SLAB) {
      EXPECT_THAT(ParseHostSlabHandle(handle.handle()), IsOk());
    } else {
      EXPECT_THAT(ParseHostEventHandle(handle.handle()), IsOk());
    }
  }
  EXPECT_EQ(slabs.count(first.lease().slab_id()), 1u);
  // Cold: the copy into staging was only enqueued, so the lease names its ready event.
  ASSERT_TRUE(first.lease().has_ready_event_id());
  EXPECT_EQ(events.count(first.lease().ready_event_id()), 1u);

  // A second lease on the same slab does not carry that slab's handle again.
  protocol->Handle(FetchRequestFor(3, "m/blocks.2"));
  const v1::SessionResponse second = answers.Await(3);
  ASSERT_EQ(second.code(), 0) << second.message();
  if (second.lease().slab_id() == first.lease().slab_id()) {
    for (const v1::Handle& handle : second.new_handles()) {
      EXPECT_FALSE(handle.kind() == v1::Handle::SLAB && handle.id() == first.lease().slab_id());
    }
  }

  v1::SessionRequest release;
  release.set_request_id(4);
  release.mutable_release()->set_lease_id(first.lease().lease_id());
  protocol->Handle(release);
  EXPECT_EQ(answers.Await(4).code(), 0);
  EXPECT_TRUE(StatsSoon([](const GpuTierStats& stats) { return stats.leases == 1; }));
  protocol->Close();  // the second lease goes with the session
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, AnOpenNamingAnotherSessionProtocolIsRefused) {
  Answers answers;
  auto protocol = NewProtocol(answers);
  v1::SessionRequest open = OpenRequest(1, "session_protocol_test");
  open.mutable_open()->set_protocol(0);  // a client from before the field: an event per lease
  protocol->Handle(open);
  const v1::SessionResponse refused = answers.Await(1);
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("session protocol 0"));
  protocol->Handle(OpenRequest(2, "session_protocol_test"));
  const v1::SessionResponse opened = answers.Await(2);
  ASSERT_EQ(opened.code(), 0) << opened.message();
  EXPECT_EQ(opened.opened().protocol(), SessionProtocolVersion());
  protocol->Close();
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, RequestsBeforeOpenAndAfterCloseAreRefused) {
  Answers answers;
  auto protocol = NewProtocol(answers);
  protocol->Handle(FetchRequestFor(1, "m/blocks.0"));
  EXPECT_EQ(answers.Await(1).code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  protocol->Handle(OpenRequest(2, "session_protocol_test"));
  EXPECT_EQ(answers.Await(2).code(), 0);
  protocol->Close();
  protocol->Handle(PrefetchRequestFor(3, "m/blocks.0"));
  EXPECT_EQ(answers.Await(3).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, AHalfCloseAnswersWhatIsInFlightBeforeTheSessionCloses) {
  Answers answers;
  auto protocol = NewProtocol(answers);
  protocol->Handle(OpenRequest(1, "session_protocol_test"));
  ASSERT_EQ(answers.Await(1).code(), 0);
  // Cold: the fetch is answered from the disk reader's thread, maybe after the half-close.
  protocol->Handle(FetchRequestFor(2, "m/blocks.3"));
  absl::Notification closed;
  std::vector<uint64_t> answered_when_closed;
  protocol->CloseWhenAnswered([&] {
    answered_when_closed = answers.order();
    closed.Notify();
  });
  ASSERT_TRUE(closed.WaitForNotificationWithTimeout(kTimeout));
  EXPECT_EQ(answered_when_closed, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(answers.Await(2).code(), 0) << answers.Await(2).message();
  protocol->Handle(PrefetchRequestFor(3, "m/blocks.0"));
  EXPECT_EQ(answers.Await(3).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(NothingHeldSoon());  // the lease went with the session
  protocol->Close();
}

TEST_F(SessionProtocolTest, AFetchThroughTheWireHoldsTheFilesBytes) {
  const std::string path = StartServer();
  ASSERT_NE(server_, nullptr);
  std::shared_ptr<SessionCore> core = OpenSessionCore(path);
  ASSERT_NE(core, nullptr);
  EXPECT_STREQ(core->transport_kind(), "socket");
  absl::StatusOr<v1::SessionResponse> fetched = core->Call(FetchRequestFor(0, "m/blocks.0"));
  ASSERT_THAT(fetched, IsOk());
  const v1::Lease& lease = fetched->lease();
  ASSERT_NO_FATAL_FAILURE(ExpectLeaseHoldsBlock(*core, lease, 0));
  auto stream = device_->CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stream, IsOk());
  core->ReleaseLease(lease.lease_id(), **stream);
  // The quiet release frees the lease while the session goes on.
  EXPECT_TRUE(StatsSoon([](const GpuTierStats& stats) { return stats.leases == 0; }));
  EXPECT_EQ(tier_->stats().clients, 1u);
  core.reset();  // ends the session
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, AnUndecodableFrameEndsTheSessionAndReleasesWhatItHeld) {
  const std::string path = StartServer();
  ASSERT_NE(server_, nullptr);
  const int fd = testing::OpenSessionSocketSession(path, "session_protocol_test");
  ASSERT_THAT(SendAll(fd, EncodeFrame(FetchRequestFor(2, "m/blocks.1"))), IsOk());
  std::string payload;
  ASSERT_THAT(ReadFrame(fd, payload), IsOk());
  v1::SessionResponse fetched;
  ASSERT_TRUE(fetched.ParseFromString(payload));
  ASSERT_EQ(fetched.code(), 0) << fetched.message();
  EXPECT_EQ(tier_->stats().leases, 1u);
  // Field 1 as a length-delimited field running past the end: no SessionRequest.
  ASSERT_THAT(SendAll(fd, EncodeFrame(std::string("\x0a\x7f", 2))), IsOk());
  // Closed without an answer.
  EXPECT_FALSE(ReadFrame(fd, payload).ok());
  ::close(fd);
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, HalfClosingTheWireStillDeliversTheAnswersInFlight) {
  const std::string path = StartServer();
  ASSERT_NE(server_, nullptr);
  std::shared_ptr<SessionCore> core = OpenSessionCore(path);
  ASSERT_NE(core, nullptr);
  Answers answers;
  ASSERT_THAT(core->Send(FetchRequestFor(0, "m/blocks.2"),
                         [&answers](const v1::SessionResponse& answer) { answers.Add(answer); }),
              IsOk());
  core.reset();  // half-closes, then reads until the daemon ends the session
  const std::vector<uint64_t> order = answers.order();
  ASSERT_EQ(order.size(), 1u);
  const v1::SessionResponse answer = answers.Await(order[0]);
  EXPECT_EQ(answer.code(), 0) << answer.message();
  EXPECT_EQ(answer.lease().key(), "m/blocks.2");
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, CallsFromManyThreadsAtOnceEachGetTheirOwnAnswer) {
  const std::string path = StartServer();
  ASSERT_NE(server_, nullptr);
  std::shared_ptr<SessionCore> core = OpenSessionCore(path);
  ASSERT_NE(core, nullptr);
  // Callers take turns reading for each other, and asynchronous answers arrive among theirs.
  constexpr int kThreads = 6;  // each holds one lease at a time: within options_.limits
  constexpr int kRounds = 40;
  std::atomic<int> wrong{0};
  std::atomic<int> callbacks{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      auto stream = device_->CreateStream(StreamPriority::kNormal);
      if (!stream.ok()) {
        ++wrong;
        return;
      }
      const std::string key = absl::StrCat("m/blocks.", t % 4);
      for (int round = 0; round < kRounds; ++round) {
        if (t == 0 && round % 4 == 0) {
          (void)core->Send(PrefetchRequestFor(0, "m/blocks.3"),
                           [&callbacks](const v1::SessionResponse&) { ++callbacks; });
        }
        absl::StatusOr<v1::SessionResponse> fetched = core->Call(FetchRequestFor(0, key));
        if (!fetched.ok() || fetched->lease().key() != key) {
          ++wrong;
          continue;
        }
        core->ReleaseLease(fetched->lease().lease_id(), **stream);
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(StatsSoon([](const GpuTierStats& stats) { return stats.leases == 0; }));
  Soon([&] { return callbacks.load() >= kRounds / 4; });
  EXPECT_EQ(callbacks.load(), kRounds / 4);
  core.reset();
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, BusyPollingOnBothEndsAnswersEveryCallAndEndsAsBefore) {
  serving_.busy_poll = absl::Microseconds(500);
  client_busy_poll_ = absl::Microseconds(500);
  const std::string path = StartServer();
  ASSERT_NE(server_, nullptr);
  std::shared_ptr<SessionCore> core = OpenSessionCore(path);
  ASSERT_NE(core, nullptr);
  auto stream = device_->CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stream, IsOk());
  // Calls back to back (each answer within the poll) and after pauses longer than it.
  for (int i = 0; i < 60; ++i) {
    if (i % 20 == 19) absl::SleepFor(absl::Milliseconds(5));
    const std::string key = absl::StrCat("m/blocks.", i % 4);
    absl::StatusOr<v1::SessionResponse> fetched = core->Call(FetchRequestFor(0, key));
    ASSERT_THAT(fetched, IsOk());
    const v1::Lease& lease = fetched->lease();
    ASSERT_EQ(lease.key(), key);
    ASSERT_NO_FATAL_FAILURE(ExpectLeaseHoldsBlock(*core, lease, i % 4));
    core->ReleaseLease(lease.lease_id(), **stream);
  }
  EXPECT_TRUE(StatsSoon([](const GpuTierStats& stats) { return stats.leases == 0; }));
  // A half-close still delivers the answer in flight, and the session ends.
  Answers answers;
  ASSERT_THAT(core->Send(FetchRequestFor(0, "m/blocks.2"),
                         [&answers](const v1::SessionResponse& answer) { answers.Add(answer); }),
              IsOk());
  core.reset();
  const std::vector<uint64_t> order = answers.order();
  ASSERT_EQ(order.size(), 1u);
  EXPECT_EQ(answers.Await(order[0]).code(), 0);
  EXPECT_TRUE(NothingHeldSoon());
  // A daemon shut down while a session's thread polls or sleeps ends it.
  std::shared_ptr<SessionCore> waiting = OpenSessionCore(path);
  ASSERT_NE(waiting, nullptr);
  server_->Shutdown(absl::Now());
  EXPECT_TRUE(NothingHeldSoon());
  EXPECT_TRUE(Soon([&] { return waiting->ended(); }));
}

// A transport that notes which thread read each answer.
class ReadThreads : public SessionTransport {
 public:
  explicit ReadThreads(std::unique_ptr<SessionTransport> transport)
      : transport_(std::move(transport)) {}
  bool Write(const v1::SessionRequest& request) override { return transport_->Write(request); }
  bool Read(v1::SessionResponse& response) override {
    const bool read = transport_->Read(response);
    if (read) {
      absl::MutexLock lock(&mu_);
      readers_[response.request_id()] = std::this_thread::get_id();
    }
    return read;
  }
  void CloseWrites() override { transport_->CloseWrites(); }
  void Abort() override { transport_->Abort(); }
  absl::Status Finish() override { return transport_->Finish(); }
  const char* kind() const override { return transport_->kind(); }

  // The thread that read the answer to `request_id`.
  std::optional<std::thread::id> reader(uint64_t request_id) {
    absl::MutexLock lock(&mu_);
    auto it = readers_.find(request_id);
    if (it == readers_.end()) return std::nullopt;
    return it->second;
  }

 private:
  const std::unique_ptr<SessionTransport> transport_;
  absl::Mutex mu_;
  std::map<uint64_t, std::thread::id> readers_ ABSL_GUARDED_BY(mu_);
};

// A call made while the session is busy reads its own answer: the answer wakes the caller, not a
// reader thread that would then have to wake it. Only the first call after a pause (the reader
// thread watches an idle session) is handed over.
TEST_F(SessionProtocolTest, ACallReadsItsOwnAnswerWhileTheSessionIsBusy) {
  const std::string path = StartServer();
  ASSERT_NE(server_, nullptr);
  ReadThreads* recorder = nullptr;
  std::shared_ptr<SessionCore> core =
      OpenSessionCore(path, [&recorder](std::unique_ptr<SessionTransport> transport) {
        auto wrapped = std::make_unique<ReadThreads>(std::move(transport));
        recorder = wrapped.get();
        return std::unique_ptr<SessionTransport>(std::move(wrapped));
      });
  ASSERT_NE(core, nullptr);
  auto stream = device_->CreateStream(StreamPriority::kNormal);
  ASSERT_THAT(stream, IsOk());
  constexpr int kCalls = 20;
  int read_by_caller = 0;
  for (int i = 0; i < kCalls; ++i) {
    absl::StatusOr<v1::SessionResponse> fetched = core->Call(FetchRequestFor(0, "m/blocks.1"));
    ASSERT_THAT(fetched, IsOk());
    const std::optional<std::thread::id> reader = recorder->reader(fetched->request_id());
    ASSERT_TRUE(reader.has_value());
    if (*reader == std::this_thread::get_id()) ++read_by_caller;
    core->ReleaseLease(fetched->lease().lease_id(), **stream);
  }
  // All but the first few: a pause of SessionCore::kIdleWatch on a loaded machine hands one over.
  EXPECT_GE(read_by_caller, kCalls - 5);

  // With an answer owed to a callback, the caller still gets its own, and the callback its.
  Answers answers;
  ASSERT_THAT(core->Send(PrefetchRequestFor(0, "m/blocks.3"),
                         [&answers](const v1::SessionResponse& answer) { answers.Add(answer); }),
              IsOk());
  absl::StatusOr<v1::SessionResponse> fetched = core->Call(FetchRequestFor(0, "m/blocks.2"));
  ASSERT_THAT(fetched, IsOk());
  EXPECT_EQ(fetched->lease().key(), "m/blocks.2");
  core->ReleaseLease(fetched->lease().lease_id(), **stream);
  Soon([&] { return !answers.order().empty(); });
  EXPECT_EQ(answers.order().size(), 1u);
  core.reset();
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, AnAnswerOwedToACallbackComesWithoutACall) {
  const std::string path = StartServer();
  ASSERT_NE(server_, nullptr);
  std::shared_ptr<SessionCore> core = OpenSessionCore(path);
  ASSERT_NE(core, nullptr);
  Answers answers;
  ASSERT_THAT(core->Send(FetchRequestFor(0, "m/blocks.1"),
                         [&answers](const v1::SessionResponse& answer) { answers.Add(answer); }),
              IsOk());
  // Nobody calls: the reader thread reads it.
  Soon([&] { return !answers.order().empty(); });
  const std::vector<uint64_t> order = answers.order();
  ASSERT_EQ(order.size(), 1u);
  EXPECT_EQ(answers.Await(order[0]).lease().key(), "m/blocks.1");
  EXPECT_EQ(tier_->stats().leases, 1u);
  core.reset();
  EXPECT_TRUE(NothingHeldSoon());
}

TEST_F(SessionProtocolTest, TheClientSeesTheSessionEndWhileItMakesNoCall) {
  const std::string path = StartServer();
  ASSERT_NE(server_, nullptr);
  std::shared_ptr<SessionCore> core = OpenSessionCore(path);
  ASSERT_NE(core, nullptr);
  ASSERT_THAT(core->Call(FetchRequestFor(0, "m/blocks.0")), IsOk());
  EXPECT_FALSE(core->ended());
  server_->Shutdown(absl::Now());  // ends the session from the daemon's side
  EXPECT_TRUE(Soon([&] { return core->ended(); }));
  absl::StatusOr<v1::SessionResponse> late = core->Call(FetchRequestFor(0, "m/blocks.0"));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(NothingHeldSoon());
}

}  // namespace
}  // namespace tierd
