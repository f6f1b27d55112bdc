"""How a session's messages travel: the daemon's session socket (length-framed protobuf on a Unix
stream socket, no HTTP/2; proto/tierd/v1/wire.proto has the format) or the gRPC Session stream.
Both carry the same tierd.v1.SessionRequest / SessionResponse messages."""

import queue
import socket
import threading

import grpc

from ._wire_format import FRAME_LENGTH as _LENGTH
from ._wire_format import MAX_FRAME_BYTES, SESSION_SOCKET_HELLO
from .errors import StatusCode, TierdError
from .v1 import tierd_pb2


def session_socket_path_for(grpc_socket):
    """Where a daemon serving gRPC on `grpc_socket` listens for sessions: X.sock -> X.session.sock."""
    if grpc_socket.endswith(".sock"):
        return grpc_socket[: -len(".sock")] + ".session.sock"
    return grpc_socket + ".session"


class SocketTransport:
    kind = "socket"

    def __init__(self, path, timeout):
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._socket.settimeout(timeout)
            self._socket.connect(path)
            self._socket.sendall(SESSION_SOCKET_HELLO)
            if self._read_exactly(len(SESSION_SOCKET_HELLO)) != SESSION_SOCKET_HELLO:
                raise OSError("the peer does not speak tierd's session protocol")
            self._socket.settimeout(None)
        except BaseException:
            self._socket.close()
            raise
        self._reader = self._socket.makefile("rb", buffering=1 << 16)
        self._send_lock = threading.Lock()

    def _read_exactly(self, count):
        data = b""
        while len(data) < count:
            chunk = self._socket.recv(count - len(data))
            if not chunk:
                break
            data += chunk
        return data

    def send(self, request):
        self.send_many((request,))

    def send_many(self, requests):
        """Sends `requests` in order, in one write."""
        frames = []
        for request in requests:
            payload = request.SerializeToString()
            frames += (_LENGTH.pack(len(payload)), payload)
        try:
            with self._send_lock:
                self._socket.sendall(b"".join(frames))
        except OSError as error:
            raise TierdError(StatusCode.UNAVAILABLE, f"the session socket broke: {error}") from None

    def receive(self):
        """The next response, or None when the daemon closed the session. Called by one thread."""
        try:
            header = self._reader.read(_LENGTH.size)
            if not header:
                self._reader.close()
                return None
            if len(header) != _LENGTH.size:
                raise TierdError(StatusCode.UNAVAILABLE, "the session socket ended inside a frame")
            (length,) = _LENGTH.unpack(header)
            if length > MAX_FRAME_BYTES:
                raise TierdError(StatusCode.INTERNAL, f"a {length}-byte frame is over the limit")
            payload = self._reader.read(length)
        except (OSError, ValueError) as error:  # ValueError: read after close
            raise TierdError(StatusCode.UNAVAILABLE, f"the session socket broke: {error}") from None
        if len(payload) != length:
            raise TierdError(StatusCode.UNAVAILABLE, "the session socket ended inside a frame")
        return tierd_pb2.SessionResponse.FromString(payload)

    def close(self):
        """Ends the session; a blocked receive() returns None."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._socket.close()


class GrpcTransport:
    kind = "grpc"
    _END = object()

    def __init__(self, stub):
        self._requests = queue.SimpleQueue()
        self._responses = stub.Session(iter(self._requests.get, self._END))

    def send(self, request):
        self._requests.put(request)

    def send_many(self, requests):
        for request in requests:
            self._requests.put(request)

    def receive(self):
        try:
            return next(self._responses)
        except StopIteration:
            return None
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED:
                return None
            raise TierdError(error.code(), f"session stream: {error.details()}") from None

    def close(self):
        self._requests.put(self._END)
        self._responses.cancel()


def client_group_socket_path_for(grpc_socket, group):
    """Where client group `group` (tierd --client-groups) opens sessions: X.sock -> X.GROUP.session.sock."""
    if grpc_socket.endswith(".sock"):
        return grpc_socket[: -len(".sock")] + "." + group + ".session.sock"
    return grpc_socket + "." + group + ".session"


def connect(grpc_socket, session_socket, stub, timeout, client_group=None):
    """The session socket where the daemon serves one, else the gRPC stream. `session_socket`:
    "default" (beside `grpc_socket`), a path, or "" for gRPC always. With `client_group`, the
    group's session socket and nothing else (OSError when it cannot be reached)."""
    if client_group:
        return SocketTransport(client_group_socket_path_for(grpc_socket, client_group), timeout)
    if session_socket:
        path = session_socket_path_for(grpc_socket) if session_socket == "default" else session_socket
        try:
            return SocketTransport(path, timeout)
        except OSError:
            pass  # an older daemon, or one started without it: the gRPC stream serves
    return GrpcTransport(stub)
