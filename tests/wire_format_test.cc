// The daemon's and the C++ client's wire formats are those proto/tierd/v1/wire.proto defines (the
// Python client's test_wire_format.py checks its own against the same definition): the session
// socket's greeting, framing and limit, and the handles the backends write and accept.
#include "wire/wire_format.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "device/host_device.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"
#include "tierd/v1/wire.pb.h"
#include "wire/frame_decoder.h"
#include "wire/session_socket.h"

#ifdef TIERD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

const v1::SessionSocketFormat& SocketFormat() {
  return v1::SessionSocketFormat::default_instance();
}
const v1::HandleFormats& Handles() { return v1::HandleFormats::default_instance(); }

// A connected pair of stream sockets, closed on destruction.
struct SocketPair {
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int fds[2] = {-1, -1};
};

TEST(WireFormatTest, TheSessionSocketGreetsWithTheProtosHello) {
  EXPECT_EQ(SocketFormat().hello(), "tierd.v1.Session\n");  // what every released daemon speaks
  EXPECT_EQ(SessionSocketHello(), SocketFormat().hello());
  EXPECT_EQ(MaxSessionFrameBytes(), SocketFormat().max_frame_bytes());
}

TEST(WireFormatTest, AFrameIsALittleEndianLengthThenThePayload) {
  EXPECT_EQ(EncodeFrame(std::string("abc")), std::string("\x03\x00\x00\x00"
                                                         "abc",
                                                         7));
  SocketPair pair;
  ASSERT_THAT(SendAll(pair.fds[0], EncodeFrame(std::string(300, 'x'))), IsOk());
  std::string payload;
  ASSERT_THAT(ReadFrame(pair.fds[1], payload), IsOk());
  EXPECT_EQ(payload, std::string(300, 'x'));
}

TEST(WireFormatTest, AFrameOverTheProtosLimitIsRefusedBeforeItsPayload) {
  SocketPair pair;
  const uint32_t over = SocketFormat().max_frame_bytes() + 1;
  char length[4];
  for (int i = 0; i < 4; ++i) length[i] = static_cast<char>(over >> (8 * i));
  ASSERT_THAT(SendAll(pair.fds[0], absl::string_view(length, 4)), IsOk());
  std::string payload;
  EXPECT_THAT(ReadFrame(pair.fds[1], payload), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(payload.empty());
}

TEST(WireFormatTest, AFrameReaderTakesFramesSentBackToBackAndLargerThanItsBuffer) {
  SocketPair pair;
  const std::string large(FrameReader::kBufferBytes * 3 + 17, 'L');
  std::string sent = EncodeFrame(std::string("release"));
  sent += EncodeFrame(std::string("fetch"));
  sent += EncodeFrame(std::string());
  sent += EncodeFrame(large);
  sent += EncodeFrame(std::string("after"));
  std::thread writer([&] { EXPECT_THAT(SendAll(pair.fds[0], sent), IsOk()); });
  FrameReader reader(pair.fds[1]);
  std::string payload;
  for (const std::string& expected :
       {std::string("release"), std::string("fetch"), std::string(), large, std::string("after")}) {
    ASSERT_THAT(reader.Next(payload), IsOk());
    EXPECT_EQ(payload, expected);
  }
  writer.join();
  ::shutdown(pair.fds[0], SHUT_WR);
  EXPECT_THAT(reader.Next(payload), StatusIs(absl::StatusCode::kOutOfRange));
}

TEST(WireFormatTest, AFrameReaderGivesAStalledFrameItsDeadlineAndNoMore) {
  SocketPair pair;
  const std::string frame = EncodeFrame(std::string("abcdef"));
  ASSERT_THAT(SendAll(pair.fds[0], frame.substr(0, 6)), IsOk());  // the length and two bytes
  FrameReader reader(pair.fds[1]);
  std::string payload;
  EXPECT_THAT(reader.Next(payload, absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // A frame cut short by the end of the stream is UNAVAILABLE, a clean end OUT_OF_RANGE.
  SocketPair cut;
  ASSERT_THAT(SendAll(cut.fds[0], frame.substr(0, 5)), IsOk());
  ::shutdown(cut.fds[0], SHUT_WR);
  FrameReader cut_reader(cut.fds[1]);
  EXPECT_THAT(cut_reader.Next(payload), StatusIs(absl::StatusCode::kUnavailable));
  // Over the limit: refused from its length.
  SocketPair over;
  const uint32_t too_long = SocketFormat().max_frame_bytes() + 1;
  char length[4];
  for (int i = 0; i < 4; ++i) length[i] = static_cast<char>(too_long >> (8 * i));
  ASSERT_THAT(SendAll(over.fds[0], absl::string_view(length, 4)), IsOk());
  FrameReader over_reader(over.fds[1]);
  EXPECT_THAT(over_reader.Next(payload), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(WireFormatTest, ABusyPollingFrameReaderReadsWhatComesWithinItsPollAndAfter) {
  SocketPair pair;
  FrameReader reader(pair.fds[1], absl::Milliseconds(20));
  std::string payload;
  // Sent while it polls; after its poll, while it sleeps; a frame split across the two.
  const std::string split = EncodeFrame(std::string("split"));
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(2));
    EXPECT_THAT(SendAll(pair.fds[0], EncodeFrame(std::string("soon"))), IsOk());
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_THAT(SendAll(pair.fds[0], EncodeFrame(std::string("late"))), IsOk());
    EXPECT_THAT(SendAll(pair.fds[0], split.substr(0, 3)), IsOk());
    absl::SleepFor(absl::Milliseconds(60));
    EXPECT_THAT(SendAll(pair.fds[0], split.substr(3)), IsOk());
  });
  const absl::Time start = absl::Now();
  for (const char* expected : {"soon", "late", "split"}) {
    ASSERT_THAT(reader.Next(payload), IsOk());
    EXPECT_EQ(payload, expected);
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(160));
  writer.join();
  // The end of the stream, seen while polling, is the clean end.
  ::shutdown(pair.fds[0], SHUT_WR);
  EXPECT_THAT(reader.Next(payload), StatusIs(absl::StatusCode::kOutOfRange));
}

// Feeds `stream` to a decoder `step` bytes at a time; the frames it handed on.
std::vector<std::string> DecodeInSteps(absl::string_view stream, size_t step) {
  FrameDecoder decoder;
  std::vector<std::string> frames;
  while (!stream.empty()) {
    const absl::string_view piece = stream.substr(0, step);
    EXPECT_THAT(decoder.Feed(piece,
                             [&](absl::string_view payload) {
                               frames.emplace_back(payload);
                               return true;
                             }),
                IsOk());
    stream.remove_prefix(piece.size());
  }
  EXPECT_FALSE(decoder.mid_frame());
  EXPECT_EQ(decoder.frames(), frames.size());
  return frames;
}

TEST(WireFormatTest, AFrameDecoderTakesFramesHoweverTheirBytesAreCut) {
  const std::string large(FrameReader::kBufferBytes * 2 + 5, 'L');
  const std::vector<std::string> expected = {"release", "fetch", "", large, "after"};
  std::string stream;
  for (const std::string& payload : expected) stream += EncodeFrame(payload);
  // All at once, a byte at a time, and in pieces that cut lengths and payloads anywhere.
  for (const size_t step : {stream.size(), size_t{1}, size_t{3}, size_t{7}, size_t{4096}}) {
    SCOPED_TRACE(step);
    EXPECT_EQ(DecodeInSteps(stream, step), expected);
  }
}

TEST(WireFormatTest, AFrameDecoderSaysWhenAFrameHasBegunAndStopsWhereItIsTold) {
  FrameDecoder decoder;
  const std::string first = EncodeFrame(std::string("first"));
  const std::string second = EncodeFrame(std::string("second"));
  int handed = 0;
  const auto count = [&](absl::string_view) {
    ++handed;
    return true;
  };
  ASSERT_THAT(decoder.Feed(first.substr(0, 2), count), IsOk());  // half a length
  EXPECT_TRUE(decoder.mid_frame());
  ASSERT_THAT(decoder.Feed(first.substr(2), count), IsOk());
  EXPECT_FALSE(decoder.mid_frame());
  EXPECT_EQ(handed, 1);
  // A handler that says stop gets no more frames from those bytes.
  FrameDecoder stopping;
  int taken = 0;
  ASSERT_THAT(stopping.Feed(first + second,
                            [&](absl::string_view) {
                              ++taken;
                              return false;
                            }),
              IsOk());
  EXPECT_EQ(taken, 1);
}

TEST(WireFormatTest, AFrameDecoderRefusesALengthOverTheLimitBeforeItsPayload) {
  const uint32_t over = SocketFormat().max_frame_bytes() + 1;
  char length[4];
  for (int i = 0; i < 4; ++i) length[i] = static_cast<char>(over >> (8 * i));
  const auto never = [](absl::string_view) {
    ADD_FAILURE() << "a frame was handed on";
    return true;
  };
  FrameDecoder whole;
  EXPECT_THAT(whole.Feed(absl::string_view(length, 4), never),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Its length cut in two: refused once the length is whole, holding nothing but the length.
  FrameDecoder cut;
  ASSERT_THAT(cut.Feed(absl::string_view(length, 1), never), IsOk());
  EXPECT_THAT(cut.Feed(absl::string_view(length + 1, 3), never),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(WireFormatTest, ACudaSlabHandleIsPrefixSizeThenIpcHandle) {
  const std::string ipc(Handles().cuda_ipc_handle_bytes(), '\x5a');
  const std::string handle = EncodeCudaSlabHandle(0x0102030405060708, ipc);
  EXPECT_EQ(handle, absl::StrCat(Handles().cuda_slab_prefix(),
                                 std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8), ipc));
  absl::StatusOr<CudaSlabHandle> parsed = ParseCudaSlabHandle(handle);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->size, 0x0102030405060708u);
  EXPECT_EQ(parsed->ipc_handle, ipc);
  EXPECT_THAT(ParseCudaSlabHandle(handle.substr(0, handle.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseCudaSlabHandle(EncodeCudaEventHandle(std::string(8, '\0') + ipc)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(WireFormatTest, ACudaEventHandleIsPrefixThenIpcHandle) {
  const std::string ipc(Handles().cuda_ipc_handle_bytes(), '\x11');
  const std::string handle = EncodeCudaEventHandle(ipc);
  EXPECT_EQ(handle, absl::StrCat(Handles().cuda_event_prefix(), ipc));
  EXPECT_EQ(ParseCudaEventHandle(handle).value_or(""), ipc);
  EXPECT_THAT(ParseCudaEventHandle(handle + "x"), StatusIs(absl::StatusCode::kInvalidArgument));
#ifdef TIERD_HAVE_CUDA
  EXPECT_EQ(sizeof(cudaIpcMemHandle_t), CudaIpcHandleBytes());
  EXPECT_EQ(sizeof(cudaIpcEventHandle_t), CudaIpcHandleBytes());
#endif
}

TEST(WireFormatTest, AHostEventHandleIsPrefixTableSeparatorThenSlot) {
  const std::string handle = EncodeHostEventHandle("/tierd.1.events.0", 17);
  EXPECT_EQ(handle, absl::StrCat(Handles().host_event_prefix(), "/tierd.1.events.0",
                                 Handles().host_event_slot_separator(), "17"));
  absl::StatusOr<HostEventHandle> parsed = ParseHostEventHandle(handle);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->table_name, "/tierd.1.events.0");
  EXPECT_EQ(parsed->slot, 17u);
  for (const std::string& wrong :
       {handle.substr(0, handle.size() - 2), handle + "x", Handles().host_event_prefix(),
        absl::StrCat(Handles().host_slab_prefix(), "/tierd.1.events.0:17")}) {
    EXPECT_THAT(ParseHostEventHandle(wrong), StatusIs(absl::StatusCode::kInvalidArgument)) << wrong;
  }
}

TEST(WireFormatTest, TheHostBackendWritesAndOpensHandlesAsTheProtoDefines) {
  absl::StatusOr<std::unique_ptr<HostDevice>> device = HostDevice::Create();
  ASSERT_THAT(device, IsOk());
  absl::StatusOr<std::unique_ptr<Slab>> slab = (*device)->AllocateSlab(4096);
  ASSERT_THAT(slab, IsOk());
  const std::string& slab_handle = (*slab)->handle();
  ASSERT_EQ(slab_handle.rfind(Handles().host_slab_prefix(), 0), 0u) << slab_handle;
  absl::StatusOr<absl::string_view> name = ParseHostSlabHandle(slab_handle);
  ASSERT_THAT(name, IsOk());
  // A handle spelled from the proto's layout opens the same memory.
  absl::StatusOr<std::unique_ptr<Slab>> opened =
      (*device)->OpenSlab(absl::StrCat(Handles().host_slab_prefix(), *name));
  ASSERT_THAT(opened, IsOk());
  std::memset((*slab)->data(), 0x7e, 4096);
  EXPECT_EQ(static_cast<const unsigned char*>((*opened)->data())[4095], 0x7e);

  absl::StatusOr<std::unique_ptr<Event>> event = (*device)->CreateEvent();
  ASSERT_THAT(event, IsOk());
  absl::StatusOr<HostEventHandle> parsed = ParseHostEventHandle((*event)->handle());
  ASSERT_THAT(parsed, IsOk());
  EXPECT_THAT((*device)->OpenEvent(EncodeHostEventHandle(parsed->table_name, parsed->slot)),
              IsOk());
  // The other kind, or the other backend, is refused before anything is opened.
  EXPECT_THAT((*device)->OpenSlab((*event)->handle()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*device)->OpenEvent(slab_handle), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*device)->OpenSlab(EncodeCudaSlabHandle(4096, std::string(64, '\0'))),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tierd
