// The daemon's and the C++ client's wire formats are those proto/tierd/v1/wire.proto defines (the
// Python client's test_wire_format.py checks its own against the same definition): the session
// socket's greeting, framing and limit. (The backends' handles: handle_format_test.)
#include "wire/wire_format.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/test_support.h"
#include "tierd/v1/wire.pb.h"
#include "wire/frame_decoder.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

using ::tierd::testing::IsOk;
using ::tierd::testing::StatusIs;

const v1::SessionSocketFormat& SocketFormat() {
  return v1::SessionSocketFormat::default_instance();
}

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

}  // namespace
}  // namespace tierd
