"""The session wire's byte formats, read from their one definition (proto/tierd/v1/wire.proto,
generated as tierd.v1.wire_pb2) rather than spelled here: the session socket's greeting and frame
limit, and the layouts of the backends' slab and event handles. The daemon reads the same
definition (wire/wire_format.h, device/handle_format.h). The parse functions check only a handle's layout and raise
TierdError(INVALID_ARGUMENT) saying which kind of handle it is not; what a handle names the backend
checks."""

import struct

from .errors import StatusCode, TierdError
from .v1 import wire_pb2

_SOCKET = wire_pb2.SessionSocketFormat()
_HANDLES = wire_pb2.HandleFormats()

SESSION_SOCKET_HELLO = _SOCKET.hello.encode()
MAX_FRAME_BYTES = _SOCKET.max_frame_bytes
# What OpenSession.protocol and SessionOpened.protocol must name (SessionProtocol).
SESSION_PROTOCOL = wire_pb2.SessionProtocol().version
# Each frame's length: a little-endian uint32.
FRAME_LENGTH = struct.Struct("<I")

CUDA_SLAB_PREFIX = _HANDLES.cuda_slab_prefix.encode()
CUDA_EVENT_PREFIX = _HANDLES.cuda_event_prefix.encode()
CUDA_IPC_HANDLE_BYTES = _HANDLES.cuda_ipc_handle_bytes
# A CUDA slab's size, after its prefix: a little-endian uint64.
CUDA_SLAB_SIZE = struct.Struct("<Q")
HOST_SLAB_PREFIX = _HANDLES.host_slab_prefix.encode()
HOST_EVENT_PREFIX = _HANDLES.host_event_prefix.encode()
HOST_EVENT_SLOT_SEPARATOR = _HANDLES.host_event_slot_separator


def _not_a(kind):
    return TierdError(StatusCode.INVALID_ARGUMENT, f"not a {kind} handle")


def parse_cuda_slab_handle(handle):
    """(size, IPC memory handle bytes) of a CUDA slab handle."""
    if (not handle.startswith(CUDA_SLAB_PREFIX) or
            len(handle) != len(CUDA_SLAB_PREFIX) + CUDA_SLAB_SIZE.size + CUDA_IPC_HANDLE_BYTES):
        raise _not_a("CUDA slab")
    (size,) = CUDA_SLAB_SIZE.unpack_from(handle, len(CUDA_SLAB_PREFIX))
    return size, bytes(handle[len(CUDA_SLAB_PREFIX) + CUDA_SLAB_SIZE.size:])


def parse_cuda_event_handle(handle):
    """The IPC event handle bytes of a CUDA event handle."""
    if not handle.startswith(CUDA_EVENT_PREFIX):
        raise _not_a("CUDA event")
    return bytes(handle[len(CUDA_EVENT_PREFIX):])


def parse_host_slab_handle(handle):
    """The name of a host slab's shared memory object."""
    if not handle.startswith(HOST_SLAB_PREFIX):
        raise _not_a("host slab")
    return handle[len(HOST_SLAB_PREFIX):].decode("utf-8", "replace")


def parse_host_event_handle(handle):
    """(event table's shared memory name, slot) of a host event handle."""
    if not handle.startswith(HOST_EVENT_PREFIX):
        raise _not_a("host event")
    rest = handle[len(HOST_EVENT_PREFIX):].decode("utf-8", "replace")
    name, _, slot = rest.rpartition(HOST_EVENT_SLOT_SEPARATOR)
    if not slot.isdigit():
        raise _not_a("host event")
    return name, int(slot)
