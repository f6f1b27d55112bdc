// The fixture of the node host tier's tests (node_host_tier_test.cc,
// node_host_tier_leases_test.cc): kDaemons daemon processes with --peers on the device under test,
// model "m" registered with each, and clients and sessions to each.
#ifndef TIERD_TESTS_SYSTEM_NODE_HOST_TIER_TEST_FIXTURE_H_
#define TIERD_TESTS_SYSTEM_NODE_HOST_TIER_TEST_FIXTURE_H_

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/tierd_client.h"
#include "common/status_macros.h"
#include "device/shared_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/storage_test_support.h"
#include "tests/test_support.h"
#include "wire/session_socket.h"
#include "wire/wire_format.h"

namespace tierd::node_host_tier_test {

using ::tierd::testing::FetchBytes;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::RandomTensor;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::StatusIs;
using ::tierd::testing::StoreBytes;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;
using ::tierd::testing::TensorSpec;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr int kDaemons = 3;

class NodeHostTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = absl::StrCat(dir_.path(), "/model");
    ASSERT_EQ(::mkdir(model_dir_.c_str(), 0755), 0);
    // 16 objects of 256 KiB to 1 MiB, one per tensor: 10 MiB.
    WriteModel(16, 64);
  }

  // Writes model "m" (before the daemons start): `objects` tensors of 1 to 4 times `rows` rows of
  // 4 KiB, one object each.
  void WriteModel(int objects, uint64_t rows) {
    tensors_.clear();
    model_bytes_ = 0;
    for (int i = 0; i < objects; ++i) {
      tensors_.push_back(
          RandomTensor(absl::StrCat("w", i), "F32", {rows * (1 + i % 4), 1024}, 100 + i));
      model_bytes_ += tensors_.back().data.size();
    }
    ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/model.safetensors"), tensors_),
                IsOk());
  }

  void TearDown() override {
    sessions_.clear();
    clients_.clear();
    for (int i = kDaemons - 1; i >= 0; --i) StopDaemon(i);
  }

  std::string socket_path(int i) const { return absl::StrCat(dir_.path(), "/gpu", i, ".sock"); }

  // Every daemon names the whole node, itself included, as a shared configuration would.
  void StartDaemons(const std::string& host_cache_bytes = "16MiB",
                    const std::vector<std::string>& extra = {}) {
    extra_flags_ = extra;
    host_cache_bytes_ = host_cache_bytes;
    for (int i = 0; i < kDaemons; ++i) {
      StartDaemon(i);
      if (HasFatalFailure()) return;
    }
    for (int i = 0; i < kDaemons; ++i) {
      const auto other = other_model_dir_.find(i);
      ASSERT_THAT(
          client(i).RegisterModel("m", other == other_model_dir_.end() ? model_dir_ : other->second,
                                  v1::GROUPING_TENSOR),
          IsOk());
    }
  }

  // Daemon i, with the flags StartDaemons was given.
  void StartDaemon(int i) {
    std::vector<std::string> argv = {
        SiblingBinary("tierd"),
        absl::StrCat("--device=", testing::DeviceUnderTest().ToString()),
        absl::StrCat("--socket=", socket_path(i)),
        absl::StrCat("--state-dir=", dir_.path(), "/state", i),
        absl::StrCat("--host-cache-bytes=", host_cache_bytes_),
        "--gpu-pool-bytes=16MiB",
        "--gpu-slab-bytes=8MiB",
        "--reader-threads=2",
        "--shutdown-grace-ms=500",
        "--compress-weights=true",  // off by default in the daemon; the tests serve weights
        "--decode-scratch-mib=64",  // objects of more than 20 MiB decode in pieces
        "--node-home-timeout-ms=2000",
        absl::StrCat("--peers=", socket_path(0), ",", socket_path(1), ",", socket_path(2))};
    argv.insert(argv.end(), extra_flags_.begin(), extra_flags_.end());
    auto daemon = testing::StartServingDaemon(argv, socket_path(i), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemons_[i] = *std::move(daemon);
  }

  void StopDaemon(int i) {
    if (daemons_[i] == nullptr) return;
    daemons_[i]->Signal(SIGTERM);
    EXPECT_THAT(daemons_[i]->Wait(kTimeout), IsOkAndHolds(0));
    daemons_[i].reset();
  }

  Client& client(int i) {
    std::unique_ptr<Client>& client = clients_[i];
    if (client == nullptr) {
      ClientOptions options;
      options.socket_path = socket_path(i);
      options.client_name = absl::StrCat("node_host_tier_test to ", i);
      auto connected = Client::Connect(options);
      EXPECT_THAT(connected, IsOk());
      if (connected.ok()) client = *std::move(connected);
    }
    return *client;
  }

  Session& session(int i) {
    std::unique_ptr<Session>& session = sessions_[i];
    if (session == nullptr) {
      auto opened = client(i).OpenSession();
      EXPECT_THAT(opened, IsOk());
      if (opened.ok()) session = *std::move(opened);
    }
    return *session;
  }

  v1::Stats Stats(int i) {
    auto stats = client(i).GetStats();
    EXPECT_THAT(stats, IsOk());
    return stats.ok() ? *stats : v1::Stats();
  }

  // Waits until no peer holds a host lease on daemon i: they are given back once the copies that
  // read them have completed, shortly after the fetches are answered.
  void ExpectHostLeasesDrain(int i) {
    uint64_t held = 0;
    for (const absl::Time deadline = absl::Now() + kTimeout; absl::Now() < deadline;) {
      held = Stats(i).node_host_leases();
      if (held == 0) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "peers still hold " << held << " host lease(s) on daemon " << i;
  }

  // Fetches every object through daemon i and checks its bytes.
  void FetchAllAndCheck(int i) {
    for (const TensorSpec& tensor : tensors_) {
      EXPECT_THAT(FetchBytes(session(i), "m/" + tensor.name), IsOkAndHolds(tensor.data))
          << "daemon " << i << ", " << tensor.name;
    }
  }

  // Fetches every object through daemon i's session `own` once, starting at object `first`, and
  // evicts them from its GPU; returns how many answers were wrong or failed (each a test failure
  // too).
  int LoadRound(int i, Session& own, size_t first) {
    int wrong = 0;
    for (size_t t = 0; t < tensors_.size(); ++t) {
      const TensorSpec& tensor = tensors_[(first + t) % tensors_.size()];
      absl::StatusOr<std::string> bytes = FetchBytes(own, "m/" + tensor.name);
      if (!bytes.ok() || *bytes != tensor.data) {
        ++wrong;
        ADD_FAILURE() << "daemon " << i << ", " << tensor.name << ": "
                      << (bytes.ok() ? "wrong bytes" : bytes.status().ToString());
      }
    }
    (void)own.Evict("m/", v1::TIER_GPU);
    return wrong;
  }

  // The objects homed on daemon i, by their index in tensors_.
  std::vector<size_t> HomedOn(int i) {
    std::vector<size_t> homed;
    auto listed = client(0).ListObjects("m");
    EXPECT_THAT(listed, IsOk());
    if (!listed.ok()) return homed;
    for (const v1::ObjectInfo& object : *listed) {
      if (object.home() == socket_path(i)) homed.push_back(std::stoul(object.key().substr(3)));
    }
    std::sort(homed.begin(), homed.end());
    return homed;
  }

  // The daemon that is home to the most bytes of model m. Homes follow the members' socket paths,
  // which change from run to run, so a test that needs a home holding much picks it with this:
  // the most homed holds at least a third of the model.
  int MostHomed() {
    int most = 0;
    uint64_t most_bytes = 0;
    for (int i = 0; i < kDaemons; ++i) {
      uint64_t bytes = 0;
      for (size_t t : HomedOn(i)) bytes += tensors_[t].data.size();
      if (bytes > most_bytes) {
        most = i;
        most_bytes = bytes;
      }
    }
    return most;
  }

  // A session on daemon i's session socket that opens as a node's daemon does; `fd` its socket.
  struct RawSession {
    int fd = -1;
    uint64_t next_id = 2;
    std::string arena;  // the name of the home's host arena, sent with the open answer
  };
  RawSession OpenAsNodeDaemon(int i) {
    RawSession raw;
    raw.fd = testing::ConnectUnix(SessionSocketPathFor(socket_path(i)));
    v1::SessionRequest open = testing::OpenRequest(1, "node_host_tier_test as a daemon");
    open.mutable_open()->set_node_daemon(true);
    EXPECT_THAT(SendAll(raw.fd, absl::StrCat(SessionSocketHello(), EncodeFrame(open))), IsOk());
    std::string greeting(SessionSocketHello().size(), '\0');
    EXPECT_THAT(ReadExactly(raw.fd, greeting.data(), greeting.size()), IsOk());
    absl::StatusOr<v1::SessionResponse> opened = Answer(raw);
    EXPECT_THAT(opened, IsOk());
    if (opened.ok()) {
      for (const v1::Handle& handle : opened->new_handles()) {
        if (handle.kind() == v1::Handle::HOST_ARENA) raw.arena = handle.handle();
      }
    }
    return raw;
  }
  absl::StatusOr<v1::SessionResponse> Answer(RawSession& raw) {
    std::string payload;
    RETURN_IF_ERROR(ReadFrame(raw.fd, payload));
    v1::SessionResponse response;
    if (!response.ParseFromString(payload))
      return absl::InternalError("an answer that does not parse");
    if (response.code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
    }
    return response;
  }
  // A host lease on `key`, as a node's daemon asks for one.
  absl::StatusOr<v1::SessionResponse> LeaseHost(RawSession& raw, const std::string& key) {
    v1::SessionRequest request = testing::FetchRequestFor(raw.next_id++, key);
    request.mutable_fetch()->set_local_only(true);
    request.mutable_fetch()->set_host_lease(true);
    RETURN_IF_ERROR(SendAll(raw.fd, EncodeFrame(request)));
    return Answer(raw);
  }
  absl::Status ReleaseHost(RawSession& raw, uint64_t lease_id) {
    v1::SessionRequest request;
    request.set_request_id(raw.next_id++);
    request.mutable_release()->set_lease_id(lease_id);
    RETURN_IF_ERROR(SendAll(raw.fd, EncodeFrame(request)));
    return Answer(raw).status();
  }

  TempDir dir_;
  std::string host_cache_bytes_;
  std::vector<std::string> extra_flags_;
  std::string model_dir_;
  std::vector<TensorSpec> tensors_;
  uint64_t model_bytes_ = 0;
  // Daemons that register "m" from another directory than model_dir_.
  std::map<int, std::string> other_model_dir_;
  std::unique_ptr<Subprocess> daemons_[kDaemons];
  std::map<int, std::unique_ptr<Client>> clients_;
  std::map<int, std::unique_ptr<Session>> sessions_;
};

}  // namespace tierd::node_host_tier_test

#endif  // TIERD_TESTS_SYSTEM_NODE_HOST_TIER_TEST_FIXTURE_H_
