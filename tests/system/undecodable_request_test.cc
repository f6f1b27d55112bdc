// Requests whose bytes do not decode (not protobuf wire format, or a string field that is not
// UTF-8, which proto3 requires) sent to a real daemon process as raw bytes, the way a client built
// from another copy of the proto, or a broken one, would send them: every method answers
// INVALID_ARGUMENT naming the message and what could not be parsed.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon_test_support.h"
#include "tests/test_support.h"
#include "tierd/v1/tierd.pb.h"
#include "wire/session_socket.h"
#include "wire/wire_format.h"

namespace tierd {
namespace {

using ::tierd::testing::ConnectUnix;
using ::tierd::testing::IsOk;
using ::tierd::testing::IsOkAndHolds;
using ::tierd::testing::SiblingBinary;
using ::tierd::testing::Subprocess;
using ::tierd::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);
// Bytes that are no protobuf message: a field tag whose varint never ends.
const std::string kNotProtobuf("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11);
// A lone continuation byte: not UTF-8.
const std::string kNotUtf8("m/\x80x", 4);

// Field `field` (below 16) holding `bytes` (under 128 of them), as the wire format encodes a string
// or a nested message.
std::string LengthDelimited(int field, const std::string& bytes) {
  return absl::StrCat(std::string(1, static_cast<char>(field << 3 | 2)),
                      std::string(1, static_cast<char>(bytes.size())), bytes);
}

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// A stream call that writes `requests` as they are, half-closes, and collects every answer and
// the final status.
class RawStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawStream(grpc::GenericStub& stub, const std::string& method, std::vector<std::string> requests)
      : requests_(std::move(requests)) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
    stub.PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    StartRead(&read_);
    WriteNext();
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    answers_.push_back(ToString(read_));
    StartRead(&read_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

  // The answers and the final status, once the call is over.
  const std::vector<std::string>& answers() {
    Wait();
    return answers_;
  }
  const grpc::Status& status() {
    Wait();
    return status_;
  }

 private:
  void Wait() { ASSERT_TRUE(done_.WaitForNotificationWithTimeout(kTimeout + absl::Seconds(5))); }
  void WriteNext() {
    if (next_ == requests_.size()) {
      StartWritesDone();
      return;
    }
    write_ = ToByteBuffer(requests_[next_++]);
    StartWrite(&write_);
  }

  grpc::ClientContext context_;
  const std::vector<std::string> requests_;
  size_t next_ = 0;
  grpc::ByteBuffer write_;
  grpc::ByteBuffer read_;
  std::vector<std::string> answers_;
  grpc::Status status_;
  absl::Notification done_;
};

class UndecodableRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The daemon's log goes to a file the tests read (through sh, which execs tierd).
    auto daemon = testing::StartServingDaemon(
        {"/bin/sh", "-c", absl::StrCat("exec \"$0\" \"$@\" 2>", log_path()), SiblingBinary("tierd"),
         "--device=host", absl::StrCat("--socket=", socket_path()),
         absl::StrCat("--state-dir=", dir_.path(), "/state"), "--host-cache-bytes=16MiB",
         "--gpu-pool-bytes=2MiB", "--gpu-slab-bytes=1MiB", "--shutdown-grace-ms=1000"},
        socket_path(), kTimeout);
    ASSERT_THAT(daemon, IsOk());
    daemon_ = *std::move(daemon);
    stub_ = std::make_unique<grpc::GenericStub>(grpc::CreateChannel(
        absl::StrCat("unix:", socket_path()), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (daemon_ != nullptr) {
      daemon_->Signal(SIGTERM);
      EXPECT_THAT(daemon_->Wait(kTimeout), IsOkAndHolds(0));
    }
    if (HasFailure()) std::fprintf(stderr, "tierd's log:\n%s", Log().c_str());
  }

  std::string socket_path() const { return absl::StrCat(dir_.path(), "/gpu0.sock"); }
  std::string log_path() const { return absl::StrCat(dir_.path(), "/tierd.log"); }
  std::string Log() const {
    std::ifstream in(log_path());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  // Calls unary method `method` ("Prefetch") with `request` as it is.
  grpc::Status Unary(const std::string& method, const std::string& request) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
    const grpc::ByteBuffer request_buffer = ToByteBuffer(request);
    grpc::ByteBuffer response;
    absl::Notification done;
    grpc::Status status;
    stub_->UnaryCall(&context, absl::StrCat("/tierd.v1.Tierd/", method), grpc::StubOptions(),
                     &request_buffer, &response, [&](grpc::Status result) {
                       status = std::move(result);
                       done.Notify();
                     });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(kTimeout + absl::Seconds(5)));
    return status;
  }

  TempDir dir_;
  std::unique_ptr<Subprocess> daemon_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

TEST_F(UndecodableRequestTest, UnaryCallsNameTheStringFieldThatIsNotUtf8) {
  grpc::Status status = Unary("Prefetch", LengthDelimited(1, kNotUtf8));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "the request is not a valid tierd.v1.PrefetchRequest: field keys is not valid UTF-8");

  status = Unary("ListObjects", LengthDelimited(1, kNotUtf8));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "the request is not a valid tierd.v1.ListObjectsRequest: field model is not valid "
            "UTF-8");

  // A valid key in front of the invalid one: the field is still named.
  status = Unary("Prefetch", LengthDelimited(1, "m/fine") + LengthDelimited(1, kNotUtf8));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "the request is not a valid tierd.v1.PrefetchRequest: field keys is not valid UTF-8");
}

TEST_F(UndecodableRequestTest, UnaryCallsSayWhenTheBytesAreNotProtobuf) {
  for (const char* method :
       {"ListModels", "ListObjects", "DropModel", "Prefetch", "Evict", "GetStats", "ListHandles"}) {
    const grpc::Status status = Unary(method, kNotProtobuf);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(status.error_message(),
                ::testing::StartsWith("the request is not a valid tierd.v1."))
        << method;
    EXPECT_THAT(status.error_message(), ::testing::EndsWith(": not protobuf wire format"))
        << method;
  }
  EXPECT_EQ(Unary("Evict", kNotProtobuf).error_message(),
            "the request is not a valid tierd.v1.EvictRequest: not protobuf wire format");
  // The same calls with valid bytes are served.
  EXPECT_TRUE(Unary("GetStats", "").ok());
  EXPECT_TRUE(Unary("ListModels", "").ok());
}

TEST_F(UndecodableRequestTest, RegisterModelRefusesAnUndecodableRequestBeforeItStreams) {
  RawStream call(*stub_, "/tierd.v1.Tierd/RegisterModel", {LengthDelimited(1, kNotUtf8)});
  EXPECT_THAT(call.answers(), ::testing::IsEmpty());
  EXPECT_EQ(call.status().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(call.status().error_message(),
            "the request is not a valid tierd.v1.RegisterModelRequest: field name is not valid "
            "UTF-8");
}

TEST_F(UndecodableRequestTest, TheSessionStreamAnswersWhatCameBeforeThenEndsWithInvalidArgument) {
  v1::SessionRequest open;
  open.set_request_id(1);
  open.mutable_open()->set_client_name("undecodable");
  open.mutable_open()->set_protocol(SessionProtocolVersion());
  v1::SessionRequest fetch;
  fetch.set_request_id(2);
  fetch.mutable_fetch()->set_key("m/nothing");
  // request_id 3, then a fetch whose key is not UTF-8.
  const std::string bad_fetch =
      absl::StrCat("\x08\x03", LengthDelimited(4, LengthDelimited(1, kNotUtf8)));
  RawStream call(
      *stub_, "/tierd.v1.Tierd/Session",
      {open.SerializeAsString(), fetch.SerializeAsString(), bad_fetch, fetch.SerializeAsString()});
  ASSERT_EQ(call.answers().size(), 2u);
  v1::SessionResponse response;
  ASSERT_TRUE(response.ParseFromString(call.answers()[0]));
  EXPECT_EQ(response.request_id(), 1u);
  EXPECT_EQ(response.code(), 0) << response.message();
  ASSERT_TRUE(response.ParseFromString(call.answers()[1]));
  EXPECT_EQ(response.request_id(), 2u);
  EXPECT_EQ(response.code(), static_cast<int>(absl::StatusCode::kNotFound)) << response.message();
  EXPECT_EQ(call.status().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(call.status().error_message(),
            "the request is not a valid tierd.v1.SessionRequest: field fetch.key is not valid "
            "UTF-8");

  RawStream garbage(*stub_, "/tierd.v1.Tierd/Session", {kNotProtobuf});
  EXPECT_THAT(garbage.answers(), ::testing::IsEmpty());
  EXPECT_EQ(garbage.status().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(garbage.status().error_message(),
            "the request is not a valid tierd.v1.SessionRequest: not protobuf wire format");
}

TEST_F(UndecodableRequestTest, TheSessionSocketClosesOnAnUndecodableFrameAndLogsWhy) {
  v1::SessionRequest open;
  open.set_request_id(1);
  open.mutable_open()->set_client_name("undecodable");
  open.mutable_open()->set_protocol(SessionProtocolVersion());
  const int fd = ConnectUnix(SessionSocketPathFor(socket_path()));
  ASSERT_THAT(
      SendAll(fd, absl::StrCat(SessionSocketHello(), EncodeFrame(open),
                               EncodeFrame(absl::StrCat(
                                   "\x08\x02", LengthDelimited(4, LengthDelimited(1, kNotUtf8)))))),
      IsOk());
  std::string greeting(SessionSocketHello().size(), '\0');
  ASSERT_THAT(ReadExactly(fd, greeting.data(), greeting.size()), IsOk());
  std::string payload;
  ASSERT_THAT(ReadFrame(fd, payload), IsOk());
  v1::SessionResponse opened;
  ASSERT_TRUE(opened.ParseFromString(payload));
  EXPECT_EQ(opened.code(), 0) << opened.message();
  // Then the connection is closed, and the log says why.
  EXPECT_THAT(ReadFrame(fd, payload), testing::StatusIs(absl::StatusCode::kOutOfRange));
  ::close(fd);
  EXPECT_THAT(Log(), ::testing::HasSubstr("session socket: the request is not a valid "
                                          "tierd.v1.SessionRequest: field fetch.key is not valid "
                                          "UTF-8; closing the session"));
}

}  // namespace
}  // namespace tierd
