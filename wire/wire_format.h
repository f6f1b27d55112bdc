// The session wire's constants, as proto/tierd/v1/wire.proto defines them once: the session
// socket's greeting and frame limit, and the session protocol's version. (The handles' bytes, a
// fact about each device backend, are device/handle_format.h's.) The Python client reads the same
// definitions from its generated tierd.v1.wire_pb2.
//
// Thread-safe: everything here is a pure function of its arguments.
#ifndef TIERD_WIRE_WIRE_FORMAT_H_
#define TIERD_WIRE_WIRE_FORMAT_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace tierd {

// What a session socket's client sends first and the daemon answers with (SessionSocketFormat).
absl::string_view SessionSocketHello();
// The largest payload of one session socket frame.
uint32_t MaxSessionFrameBytes();
// The session protocol's version (SessionProtocol): what OpenSession.protocol and
// SessionOpened.protocol must name.
uint32_t SessionProtocolVersion();

}  // namespace tierd

#endif  // TIERD_WIRE_WIRE_FORMAT_H_
