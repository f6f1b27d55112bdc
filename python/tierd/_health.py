"""grpc.health.v1's Check answer read without the generated module: what
Client.wait_until_ready asks the daemon."""

from .errors import StatusCode, TierdError

# grpc.health.v1.Health/Check without the generated module (grpcio-health-checking is a package of
# its own): the request is a HealthCheckRequest, empty on the wire for the server as a whole, and
# the response's field 1 is its ServingStatus.
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_SERVING = 1
_SERVING_STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _read_varint(data, at):
    """The protobuf varint at data[at:] and the offset after it."""
    value = 0
    for shift in range(0, 64, 7):
        if at >= len(data):
            break
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    raise TierdError(StatusCode.INTERNAL, "a malformed health check response")


def _serving_status(response):
    """The status (field 1) of a serialized HealthCheckResponse; UNKNOWN (0) when absent."""
    status = 0
    at = 0
    while at < len(response):
        key, at = _read_varint(response, at)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, at = _read_varint(response, at)
            if field == 1:
                status = value
        elif wire_type == 1:
            at += 8
        elif wire_type == 2:
            length, at = _read_varint(response, at)
            at += length
        elif wire_type == 5:
            at += 4
        else:
            raise TierdError(StatusCode.INTERNAL, "a malformed health check response")
    if at > len(response):
        raise TierdError(StatusCode.INTERNAL, "a malformed health check response")
    return status
