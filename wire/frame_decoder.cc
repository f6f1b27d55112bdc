#include "wire/frame_decoder.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "wire/wire_format.h"

namespace tierd {
namespace {

constexpr size_t kLengthBytes = 4;

uint32_t LengthAt(const char* data) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  return bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
}

absl::Status CheckLength(uint32_t length) {
  if (length <= MaxSessionFrameBytes()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("a session message of ", length,
                                                 " bytes; the limit is ", MaxSessionFrameBytes()));
}

}  // namespace

absl::Status FrameDecoder::Feed(absl::string_view bytes, OnFrame on_frame) {
  while (!bytes.empty()) {
    if (pending_.empty() && bytes.size() >= kLengthBytes) {
      // A frame starts here: handed on from `bytes` if all of it is there.
      const uint32_t length = LengthAt(bytes.data());
      if (absl::Status checked = CheckLength(length); !checked.ok()) return checked;
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
      if (absl::Status checked = CheckLength(LengthAt(pending_.data())); !checked.ok()) {
        return checked;
      }
    }
    const size_t whole = kLengthBytes + LengthAt(pending_.data());
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
