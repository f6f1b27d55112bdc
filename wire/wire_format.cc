#include "wire/wire_format.h"

#include "tierd/v1/wire.pb.h"

namespace tierd {
namespace {

const v1::SessionSocketFormat& SocketFormat() {
  return v1::SessionSocketFormat::default_instance();
}

}  // namespace

absl::string_view SessionSocketHello() { return SocketFormat().hello(); }

uint32_t MaxSessionFrameBytes() { return SocketFormat().max_frame_bytes(); }

uint32_t SessionProtocolVersion() { return v1::SessionProtocol::default_instance().version(); }

}  // namespace tierd
