"""tierd's errors: one exception type carrying the daemon's status code.

Codes follow the API's rules (proto/tierd/v1/tierd.proto): NOT_FOUND for an unknown key or lease,
INVALID_ARGUMENT for a malformed request, RESOURCE_EXHAUSTED for a budget or quota, FAILED_PRECONDITION
for a call out of order, DATA_LOSS for a checksum mismatch, UNAVAILABLE when the daemon is going away
or the session has ended (reconnect and retry).
"""

import grpc

StatusCode = grpc.StatusCode

_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class TierdError(Exception):
    """A call failed; `code` is a grpc.StatusCode and `message` the daemon's (or client's) reason."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def code_from_number(number):
    """The grpc.StatusCode numbered `number` on the wire (google.rpc.Code), UNKNOWN if none is."""
    return _BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


def from_rpc_error(error, what):
    """A TierdError for a failed gRPC call."""
    return TierdError(error.code(), f"{what}: {error.details()}")
