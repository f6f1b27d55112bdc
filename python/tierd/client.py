"""The Python client: `Client` for the unary calls, `Session` for the data path, `Lease` for a
fetched object's tensors.

A fetched object is a set of torch tensors viewing the daemon's staging buffer in place: CUDA
tensors over an IPC-opened slab when the daemon runs on a GPU, CPU tensors over shared memory when
it runs the host backend. Nothing is copied and no bytes cross the socket. The lease protocol
(proto/tierd/v1/tierd.proto) is kept for the caller: fetch makes the stream wait on the copy's ready
event (the CPU does not wait), release records the done event on the stream after the caller's last
use and tells the daemon, which reuses the buffer only once that event has completed.

    client = tierd.Client("/run/tierd/gpu0.sock")
    with client.session() as session:
        with session.fetch("wan/blocks.3") as lease:      # tensors valid inside the block
            y = x @ lease.tensors["blocks.3.ffn.up.weight"].T
        session.store_async("acts/s_kv_cond_12", kv)      # copied on the current stream
        session.flush()                                    # committed to the host tier
"""

import os
import time

import grpc

from . import _transport
from ._health import _HEALTH_CHECK, _SERVING, _SERVING_STATUS_NAMES, _serving_status
from ._session import (Lease, PendingFetch, RetainedSet, Session, _tier,  # noqa: F401 (API)
                       tensor_views)
from .errors import StatusCode, TierdError, from_rpc_error
from .v1 import tierd_pb2, tierd_pb2_grpc

_GROUPINGS = {
    "tensor": tierd_pb2.GROUPING_TENSOR,
    "block": tierd_pb2.GROUPING_BLOCK,
    "phase": tierd_pb2.GROUPING_PHASE,
}


class Client:
    """A connection to one daemon (one GPU). `socket_path` is the daemon's gRPC socket.

    session_socket: "default" (the session socket beside `socket_path`, when the daemon serves
    one), a path, or "" to carry sessions over gRPC. client_group: the client group (tierd
    --client-groups) whose sessions this client opens, on the group's own socket only; its sessions
    see only the group's staging slabs and stored objects (unary calls act on the default group).
    device: the torch device to open staging buffers on (default: the daemon's GPU ordinal, which
    assumes both see the same GPUs).
    """

    def __init__(self, socket_path="/run/tierd/gpu0.sock", client_name=None,
                 session_socket="default", device=None, timeout=30.0, client_group=None):
        self.socket_path = socket_path
        self.client_name = client_name or f"python pid {os.getpid()}"
        self.timeout = timeout
        self._session_socket = session_socket
        self._client_group = client_group
        self._device = device
        self._channel = grpc.insecure_channel(
            "unix:" + socket_path, options=[("grpc.max_receive_message_length", 64 << 20)])
        self._stub = tierd_pb2_grpc.TierdStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def session(self):
        """Opens a session (over the session socket when the daemon serves one)."""
        try:
            transport = _transport.connect(self.socket_path, self._session_socket, self._stub,
                                           self.timeout, self._client_group)
        except OSError as e:
            # Only a client group's socket is never fallen back from.
            raise TierdError(StatusCode.UNAVAILABLE,
                             f"client group {self._client_group}: cannot open a session: {e}"
                             ) from None
        try:
            return Session(self, transport, self._device)
        except BaseException:
            transport.close()
            raise

    def wait_until_ready(self, timeout=30.0):
        """Waits until the daemon serves, as its standard health check (grpc.health.v1) says, or
        raises UNAVAILABLE after `timeout` seconds. A daemon accepts connections before it serves:
        while it pins its host cache and allocates its staging pool, health says NOT_SERVING and
        calls are answered UNAVAILABLE ("tierd is starting")."""
        deadline = time.monotonic() + timeout
        check = self._channel.unary_unary(_HEALTH_CHECK)  # serialized bytes both ways
        last = "no answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TierdError(StatusCode.UNAVAILABLE,
                                 f"tierd on {self.socket_path} did not serve within {timeout} s "
                                 f"({last})")
            try:
                # An empty HealthCheckRequest: service "", the server as a whole.
                status = _serving_status(check(b"", timeout=min(left, 1.0), wait_for_ready=True))
                if status == _SERVING:
                    return
                last = f"health says {_SERVING_STATUS_NAMES.get(status, status)}"
            except grpc.RpcError as error:
                last = f"{error.code().name}: {error.details()}"
            time.sleep(min(0.02, max(deadline - time.monotonic(), 0)))

    def register_model(self, name, directory, grouping="block", progress=None, verify=False,
                       derived=(), keep_raw=False):
        """Registers a directory of .safetensors files (absolute, or relative to this process's
        working directory; or an s3://BUCKET/PREFIX/ the daemon reads through its --s3-endpoint)
        as model `name`; `progress(files_done,
        files_total, current_file)` is called as each file's header is read. With `verify`, the
        daemon reads every object now and records its checksum, so that even its first read is
        checked. `derived`: tierd_pb2.DerivedTensor messages, tensors gathered from ranges of the
        checkpoint's, which they replace (tierd.conversions makes them from transformers' checkpoint
        conversions). With `keep_raw`, the daemon never holds the model's objects compressed in
        host memory (docs/COMPRESSION.md). Returns the ModelSummary."""
        # The daemon takes absolute paths: a relative one is this process's, not the daemon's.
        directory = os.fspath(directory)
        if not directory.startswith("s3://"):
            directory = os.path.join(os.getcwd(), directory)
        request = tierd_pb2.RegisterModelRequest(name=name, directory=directory,
                                                 grouping=_grouping(grouping), verify=verify,
                                                 derived=list(derived), keep_raw=keep_raw)
        summary = None
        try:
            for message in self._stub.RegisterModel(request, timeout=None):
                if progress is not None:
                    progress(message.files_done, message.files_total, message.current_file)
                if message.HasField("summary"):
                    summary = message.summary
        except grpc.RpcError as error:
            raise from_rpc_error(error, f"register {name}") from None
        if summary is None:
            raise TierdError(StatusCode.INTERNAL, f"register {name}: the daemon sent no summary")
        return summary

    def list_models(self):
        return list(self._unary("ListModels", tierd_pb2.ListModelsRequest()).models)

    def list_objects(self, model):
        """The model's objects (ObjectInfo: key, size, tensors, on_gpu, in_host_cache, home,
        host_bytes: what it takes in host memory, its compressed form's when held compressed)."""
        return list(self._unary("ListObjects", tierd_pb2.ListObjectsRequest(model=model)).objects)

    def drop_model(self, name):
        self._unary("DropModel", tierd_pb2.DropModelRequest(name=name))

    def prefetch(self, keys, host_only=False, deadline_ms=0):
        request = tierd_pb2.PrefetchRequest(keys=keys, host_only=host_only,
                                            deadline_ms=deadline_ms)
        return self._unary("Prefetch", request).started

    def evict(self, key_or_prefix, tier="gpu"):
        response = self._unary("Evict", tierd_pb2.EvictRequest(key=key_or_prefix, tier=_tier(tier)))
        return response.evicted, response.skipped

    def stats(self):
        return self._unary("GetStats", tierd_pb2.GetStatsRequest())

    def _unary(self, method, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error, method) from None


def _grouping(name):
    if name not in _GROUPINGS:
        raise ValueError(f"grouping must be one of {sorted(_GROUPINGS)}, not {name!r}")
    return _GROUPINGS[name]
