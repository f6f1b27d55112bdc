// Takes the session socket's frames (wire/session_socket.h) apart as their bytes arrive, for a
// reader that does not block: an event loop reads whatever a socket has and feeds it here. A frame
// that arrives whole is handed on from the bytes fed, without a copy; one split across reads is
// kept until its last byte comes. The memory a frame is kept in grows as its bytes arrive: a
// length alone does not get it.
//
// Not thread-safe.
#ifndef TIERD_WIRE_FRAME_DECODER_H_
#define TIERD_WIRE_FRAME_DECODER_H_

#include <cstddef>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tierd {

class FrameDecoder {
 public:
  // Called with each complete frame's payload, valid during the call; returns whether to go on.
  using OnFrame = absl::FunctionRef<bool(absl::string_view payload)>;

  FrameDecoder() = default;
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  // Decodes `bytes`, the next ones of the stream, calling `on_frame` for each frame they complete,
  // in order. Stops, OK, where `on_frame` returns false (the rest of `bytes` is dropped).
  // INVALID_ARGUMENT for a length over MaxSessionFrameBytes(); the decoder must not be fed again.
  absl::Status Feed(absl::string_view bytes, OnFrame on_frame);

  // Whether a frame has begun and not ended: some of its bytes were fed, not all.
  bool mid_frame() const { return !pending_.empty(); }
  // Frames completed so far.
  size_t frames() const { return frames_; }

 private:
  // The bytes of the frame begun (its length's first, then its payload's), at most its whole.
  std::string pending_;
  size_t frames_ = 0;
};

}  // namespace tierd

#endif  // TIERD_WIRE_FRAME_DECODER_H_
