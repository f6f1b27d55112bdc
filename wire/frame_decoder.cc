#include "wire/frame_decoder.h"

#include <algorithm>
#include <cstdint>

#include "common/status_macros.h"
#include "wire/session_socket.h"

namespace tierd {
namespace {

constexpr size_t kLengthBytes = 4;

}  // namespace

absl::Status FrameDecoder::Feed(absl::string_view bytes, OnFrame on_frame) {
  while (!bytes.empty()) {
    if (pending_.empty() && bytes.size() >= kLengthBytes) {
      // A frame starts here: handed on from `bytes` if all of it is there.
      ASSIGN_OR_RETURN(const uint32_t length, DecodeFrameLength(bytes.data()));
      if (bytes.size() - kLengthBytes >= length) {
        ++frames_;
        if (!on_frame(bytes.substr(kLengthBytes, length))) return absl::OkStatus();
        bytes.remove_prefix(kLengthBytes + length);
        continue;
      }
    }
    // Part of a frame: kept. First its length, then as much of its payload as came.
    if (pending_.size() < kLengthBytes) {
      const size_t take = std::min(kLengthBytes - pending_.size(), bytes.size());
      pending_.append(bytes.data(), take);
      bytes.remove_prefix(take);
      if (pending_.size() < kLengthBytes) return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(const uint32_t length, DecodeFrameLength(pending_.data()));
    const size_t whole = kLengthBytes + length;
    const size_t take = std::min(whole - pending_.size(), bytes.size());
    pending_.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (pending_.size() < whole) return absl::OkStatus();
    ++frames_;
    std::string frame;
    frame.swap(pending_);
    if (!on_frame(absl::string_view(frame).substr(kLengthBytes))) return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace tierd
