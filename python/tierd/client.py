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

import collections
import logging
import os
import threading
import time

import grpc
import torch

from . import _transport
from .dtypes import ELEMENT_BYTES, to_safetensors, to_torch
from .errors import StatusCode, TierdError, code_from_number, from_rpc_error
from .v1 import tierd_pb2, tierd_pb2_grpc

_log = logging.getLogger("tierd")

# Tensors of a stored object start at multiples of this, as the daemon lays out gathered objects
# (storage/object_layout.h): a tensor's device address is as aligned as its own allocation's.
_TENSOR_ALIGNMENT = 256

_GROUPINGS = {
    "tensor": tierd_pb2.GROUPING_TENSOR,
    "block": tierd_pb2.GROUPING_BLOCK,
    "phase": tierd_pb2.GROUPING_PHASE,
}
_TIERS = {"gpu": tierd_pb2.TIER_GPU, "host": tierd_pb2.TIER_HOST, "all": tierd_pb2.TIER_ALL}


def _backend_for(opened, device):
    if opened.backend == "host":
        from ._host_backend import HostBackend

        return HostBackend()
    if opened.backend == "cuda":
        from ._cuda_backend import CudaBackend

        ordinal = opened.device_ordinal if device is None else torch.device(device).index
        return CudaBackend(ordinal)
    raise TierdError(StatusCode.FAILED_PRECONDITION,
                     f'the daemon\'s backend "{opened.backend}" is unknown to this client')


def tensor_views(buffer, infos):
    """{name: tensor} for the tensors `infos` (TensorInfo) places in `buffer` (a uint8 tensor),
    each a zero-copy view. A tensor whose offset is not a multiple of its element size cannot be
    viewed in place and is copied instead (logged once per object)."""
    views = collections.OrderedDict()
    for info in infos:
        dtype = to_torch(info.dtype)
        if info.offset + info.size > buffer.numel():
            raise TierdError(StatusCode.INTERNAL,
                             f"tensor {info.name} lies outside its object ({info.offset}+{info.size}"
                             f" > {buffer.numel()})")
        raw = buffer[info.offset: info.offset + info.size]
        if raw.storage_offset() % ELEMENT_BYTES[dtype] != 0:
            _log.warning("tensor %s is not aligned for %s in its object; copying it", info.name,
                         info.dtype)
            raw = raw.clone()
        views[info.name] = raw.view(dtype).view(tuple(info.shape))
    return views


class Lease:
    """A fetched object held in a staging buffer until released.

    `tensors` maps each tensor's name to a view of the buffer; `buffer` is all of the object's
    bytes as uint8. They are valid until release(): the daemon may then reuse the memory for
    another object. A context manager releases on exit.
    """

    def __init__(self, session, key, lease_id, buffer, tensors, done_event):
        self.key = key
        self.lease_id = lease_id
        self.buffer = buffer
        self.tensors = tensors
        self._session = session
        self._done_event = done_event
        self._released = False

    @property
    def tensor(self):
        """The object's only tensor (stored activations usually hold one)."""
        if len(self.tensors) != 1:
            raise ValueError(f"{self.key} holds {len(self.tensors)} tensors, not one")
        return next(iter(self.tensors.values()))

    @property
    def released(self):
        return self._released

    def release(self, stream=None):
        """Records the done event on `stream` (default: the current stream) after everything the
        caller has enqueued that reads the buffer, and releases the lease. Idempotent."""
        if self._released:
            return
        self._released = True
        self.tensors = {}
        self.buffer = None
        self._session._release(self.lease_id, self._done_event, stream)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class PendingFetch:
    """A fetch sent but not yet taken: result() waits for the daemon's answer and gives the Lease."""

    def __init__(self, session, key):
        self._session = session
        self.key = key
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._response = None
        self._taken = False
        self._cancelled = False

    def _answer(self, response):
        with self._lock:
            self._response = response
            cancelled = self._cancelled
        self._done.set()
        if cancelled:
            self._session._release_unread(response)

    def result(self, stream=None, timeout=None):
        """The lease, with `stream` (default: the current stream) made to wait for its bytes."""
        if self._taken:
            raise RuntimeError(f"the fetch of {self.key} was already taken")
        if not self._done.wait(self._session._timeout if timeout is None else timeout):
            raise TierdError(StatusCode.DEADLINE_EXCEEDED, f"fetch of {self.key}: no answer")
        self._taken = True
        return self._session._lease_from(self._response, stream)

    def cancel(self):
        """Gives up the fetch: its lease, when it comes, is released at once."""
        if self._taken:
            return
        self._taken = True
        with self._lock:
            self._cancelled = True
            response = self._response
        if response is not None:
            self._session._release_unread(response)


class _Pending:
    __slots__ = ("event", "response", "callback")

    def __init__(self, callback=None):
        self.event = threading.Event() if callback is None else None
        self.response = None
        self.callback = callback


class Session:
    """A session with the daemon: fetches, prefetches, stores, pins. Leases and pins belong to the
    session; closing it (or the process exiting) releases them. Thread-safe."""

    def __init__(self, client, transport, device):
        self._client = client
        self._transport = transport
        self._timeout = client.timeout
        self._lock = threading.Lock()
        self._next_request = 1
        self._pending = {}
        self._ended = None  # the TierdError every later call gets, once the stream ended
        self._handles_lock = threading.Lock()
        self._slabs = {}
        self._events = {}
        self._handle_bytes = {}
        self._commits = collections.Counter()  # key -> commits in flight
        self._commit_error = None
        self._commits_changed = threading.Condition(self._lock)
        self._backend = None
        self._reader = threading.Thread(target=self._read_loop, name="tierd-session", daemon=True)
        self._reader.start()
        request = tierd_pb2.SessionRequest()
        request.open.client_name = client.client_name
        self.info = self._call(request).opened
        try:
            self._backend = _backend_for(self.info, device)
        except BaseException:
            self.close()
            raise

    # ---- public -----------------------------------------------------------------------------

    @property
    def transport(self):
        """How this session's messages travel: "socket" or "grpc"."""
        return self._transport.kind

    @property
    def device(self):
        """The torch device the staging buffers are on in this process."""
        return self._backend.device

    def fetch(self, key, stream=None):
        """Fetches `key` ("MODEL/OBJECT" or a stored object's key) and makes `stream` (default: the
        current stream) wait for its bytes. Returns once the daemon has enqueued the copy."""
        return self.fetch_async(key).result(stream)

    def fetch_async(self, key):
        """Sends a fetch without waiting for its answer; PendingFetch.result() takes the lease.
        Fetches are served in the order they are sent."""
        self._wait_for_commits_of(key)
        pending = PendingFetch(self, key)
        request = tierd_pb2.SessionRequest()
        request.fetch.key = key
        self._send(request, pending._answer)
        return pending

    def prefetch(self, keys, deadline_ms=0, host_only=False):
        """Starts bringing `keys` towards the GPU without holding them (the seeds' begin_fetch_step
        for weights). Returns how many were not yet where asked."""
        request = tierd_pb2.SessionRequest()
        request.prefetch.keys.extend(keys)
        request.prefetch.deadline_ms = deadline_ms
        request.prefetch.host_only = host_only
        return self._call(request).prefetched.started

    def store_async(self, key, tensors, spillable=True, durable=False, stream=None):
        """Stores `tensors` ({name: tensor}, or one tensor, named NAME) as object `key`
        ("NAMESPACE/NAME").

        Reserves a staging buffer, enqueues the copy into it on `stream` (default: the current
        stream), records the written event there and sends the commit, without waiting for the
        copy or the commit: the sources must not change until the stream has run the copy. A later
        fetch of `key` through this session waits for the commit. flush() reports the outcome.
        `durable`: the object survives a restart of the daemon (the commit succeeds once it is
        written and fsynced there).
        """
        named = _named_tensors(tensors, default_name=key.rpartition("/")[2] or "tensor")
        infos, length = _layout(named)
        if length == 0:
            raise ValueError(f"{key}: nothing to store (all tensors are empty)")
        request = tierd_pb2.SessionRequest()
        request.reserve.key = key
        request.reserve.length = length
        request.reserve.spillable = spillable
        request.reserve.durable = durable
        request.reserve.tensors.extend(infos)
        reservation = self._call(request).reservation
        commit = tierd_pb2.SessionRequest()
        commit.commit.reservation_id = reservation.reservation_id
        stream = self._stream(stream)
        try:
            slab = self._slab(reservation.slab_id)
            written = self._event(reservation.written_event_id)
            buffer = slab.tensor[reservation.offset: reservation.offset + reservation.length]
            views = tensor_views(buffer, infos)
            for info, source in zip(infos, named.values()):
                self._backend.copy_into(views[info.name], source, stream)
            self._backend.record_event(written, stream)
        except BaseException:
            # Give the reservation back once nothing of ours can still write into it.
            if stream is not None:
                stream.synchronize()
            commit.commit.abort = True
            self._send_quiet(commit)
            raise
        with self._lock:
            self._commits[key] += 1
        self._send(commit, lambda response: self._commit_done(key, response))

    def flush(self, timeout=None):
        """Waits until every commit sent so far is in the daemon's host tier; raises the first
        failure since the last flush."""
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        with self._lock:
            while self._commits and self._ended is None:
                if not self._commits_changed.wait(deadline - time.monotonic()):
                    raise TierdError(StatusCode.DEADLINE_EXCEEDED, "commits still in flight")
            error, self._commit_error = self._commit_error, None
            if error is None and self._commits:
                error = self._ended
        if error is not None:
            raise error

    def wait_committed(self, key, timeout=None):
        """Waits until the commits of `key` sent so far through this session are in the daemon's
        host tier, without waiting for other keys' (flush() waits for all): then a fetch of `key`
        through another session, or another daemon (tierd --peers), finds this version. Raises the
        first commit failure since the last flush, if any."""
        self._wait_for_commits_of(key, timeout)
        with self._lock:
            error, self._commit_error = self._commit_error, None
        if error is not None:
            raise error

    def pin(self, key):
        """Keeps `key` on the GPU until unpin() or the session ends."""
        request = tierd_pb2.SessionRequest()
        request.pin.key = key
        self._call(request)

    def unpin(self, key):
        request = tierd_pb2.SessionRequest()
        request.unpin.key = key
        self._call(request)

    def evict(self, key_or_prefix, tier="gpu"):
        """Drops a key, or every key under a prefix ending in '/', from `tier` ("gpu", "host",
        "all"). Returns (evicted, skipped)."""
        request = tierd_pb2.SessionRequest()
        request.evict.key = key_or_prefix
        request.evict.tier = _tier(tier)
        evicted = self._call(request).evicted
        return evicted.evicted, evicted.skipped

    def close(self):
        """Ends the session: the daemon releases whatever it still holds for it."""
        self._transport.close()
        if threading.current_thread() is not self._reader:
            self._reader.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- the lease protocol -----------------------------------------------------------------

    def _stream(self, stream):
        return self._backend.current_stream() if stream is None else stream

    def _lease_from(self, response, stream):
        if response.code != 0:
            raise TierdError(code_from_number(response.code), response.message)
        lease = response.lease
        done = None
        try:
            slab = self._slab(lease.slab_id)
            ready = self._event(lease.ready_event_id)
            done = self._event(lease.done_event_id)
            buffer = slab.tensor[lease.offset: lease.offset + lease.length]
            tensors = tensor_views(buffer, lease.tensors)
            self._backend.wait_event(ready, self._stream(stream))
        except BaseException:
            self._release(lease.lease_id, done, stream)
            raise
        return Lease(self, lease.key, lease.lease_id, buffer, tensors, done)

    def _release(self, lease_id, done_event, stream):
        """Records `done_event` on `stream` (None: nothing of ours read the buffer, so there is
        nothing to wait for) and sends the release without waiting for an answer."""
        if done_event is not None:
            self._backend.record_event(done_event, self._stream(stream))
        request = tierd_pb2.SessionRequest()
        request.release.lease_id = lease_id
        request.release.quiet = True
        self._send_quiet(request)

    def _release_unread(self, response):
        # A cancelled fetch's answer: may run on the reader thread, so it only sends.
        if response.code == 0:
            self._release(response.lease.lease_id, None, None)

    def _commit_done(self, key, response):
        with self._lock:
            if response.code != 0 and self._commit_error is None:
                self._commit_error = TierdError(code_from_number(response.code),
                                                f"commit of {key}: {response.message}")
            self._commits[key] -= 1
            if self._commits[key] <= 0:
                del self._commits[key]
            self._commits_changed.notify_all()

    def _wait_for_commits_of(self, key, timeout=None):
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        with self._lock:
            while self._commits.get(key) and self._ended is None:
                if not self._commits_changed.wait(deadline - time.monotonic()):
                    raise TierdError(StatusCode.DEADLINE_EXCEEDED, f"commit of {key} still in flight")

    # ---- requests and responses -------------------------------------------------------------

    def _register(self, request, pending):
        with self._lock:
            if self._ended is not None:
                raise self._ended
            request.request_id = self._next_request
            self._next_request += 1
            if pending is not None:
                self._pending[request.request_id] = pending

    def _call(self, request):
        pending = _Pending()
        self._register(request, pending)
        self._transport.send(request)
        if not pending.event.wait(self._timeout):
            with self._lock:
                self._pending.pop(request.request_id, None)
            raise TierdError(StatusCode.DEADLINE_EXCEEDED,
                             f"no answer to {request.WhichOneof('op')} in {self._timeout} s")
        response = pending.response
        if response.code != 0:
            raise TierdError(code_from_number(response.code), response.message)
        return response

    def _send(self, request, callback):
        """Sends without waiting; `callback(response)` runs on the reader thread (it must not
        block), or with an UNAVAILABLE response when the session ends first."""
        self._register(request, _Pending(callback))
        self._transport.send(request)

    def _send_quiet(self, request):
        try:
            self._register(request, None)
            self._transport.send(request)
        except TierdError:
            pass  # the session ended: the daemon released everything it held for it

    def _read_loop(self):
        ended = TierdError(StatusCode.UNAVAILABLE, "the session has ended")
        try:
            while True:
                response = self._transport.receive()
                if response is None:
                    break
                if response.new_handles:
                    self._add_handles(response.new_handles)
                with self._lock:
                    pending = self._pending.pop(response.request_id, None)
                if pending is None:
                    if response.code != 0:  # a quiet request failed
                        _log.warning("tierd: request %d failed: %s", response.request_id,
                                     response.message)
                    continue
                self._deliver(pending, response)
        except TierdError as error:
            ended = error
        except Exception as error:  # a defect: end the session rather than hang its callers
            _log.exception("tierd: session reader failed")
            ended = TierdError(StatusCode.INTERNAL, f"session reader failed: {error}")
        with self._lock:
            self._ended = ended
            pending, self._pending = self._pending, {}
            self._commits_changed.notify_all()
        failed = tierd_pb2.SessionResponse(code=ended.code.value[0], message=ended.message)
        for waiter in pending.values():
            self._deliver(waiter, failed)

    @staticmethod
    def _deliver(pending, response):
        pending.response = response
        if pending.callback is not None:
            try:
                pending.callback(response)
            except Exception:
                _log.exception("tierd: a response callback failed")
        else:
            pending.event.set()

    # ---- handles ----------------------------------------------------------------------------

    def _add_handles(self, handles):
        # Only recorded here; opened on first use (the reader thread must not block on a device).
        with self._handles_lock:
            for handle in handles:
                self._handle_bytes[(handle.kind, handle.id)] = bytes(handle.handle)

    def _opened(self, kind, handle_id, cache, open_handle):
        with self._handles_lock:
            opened = cache.get(handle_id)
            if opened is not None:
                return opened
            raw = self._handle_bytes.get((kind, handle_id))
        if raw is None:
            raise TierdError(StatusCode.INTERNAL, f"the daemon never sent handle {handle_id}")
        opened = open_handle(raw)
        with self._handles_lock:
            return cache.setdefault(handle_id, opened)

    def _slab(self, slab_id):
        return self._opened(tierd_pb2.Handle.SLAB, slab_id, self._slabs, self._backend.open_slab)

    def _event(self, event_id):
        return self._opened(tierd_pb2.Handle.EVENT, event_id, self._events,
                            self._backend.open_event)


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

    def register_model(self, name, directory, grouping="block", progress=None, verify=False):
        """Registers a directory of .safetensors files (absolute, or relative to this process's
        working directory) as model `name`; `progress(files_done,
        files_total, current_file)` is called as each file's header is read. With `verify`, the
        daemon reads every object now and records its checksum, so that even its first read is
        checked. Returns the ModelSummary."""
        # The daemon takes absolute paths: a relative one is this process's, not the daemon's.
        directory = os.path.join(os.getcwd(), os.fspath(directory))
        request = tierd_pb2.RegisterModelRequest(name=name, directory=directory,
                                                 grouping=_grouping(grouping), verify=verify)
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
        """The model's objects (ObjectInfo: key, size, tensors, on_gpu, in_host_cache)."""
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


def _grouping(name):
    if name not in _GROUPINGS:
        raise ValueError(f"grouping must be one of {sorted(_GROUPINGS)}, not {name!r}")
    return _GROUPINGS[name]


def _tier(name):
    if name not in _TIERS:
        raise ValueError(f"tier must be one of {sorted(_TIERS)}, not {name!r}")
    return _TIERS[name]


def _named_tensors(tensors, default_name):
    if isinstance(tensors, torch.Tensor):
        return collections.OrderedDict([(default_name, tensors)])
    named = collections.OrderedDict(tensors)
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name!r} is a {type(tensor).__name__}, not a tensor")
    return named


def _layout(named):
    """TensorInfos placing `named` back to back at _TENSOR_ALIGNMENT, and the object's length."""
    infos = []
    offset = 0
    for name, tensor in named.items():
        size = tensor.numel() * tensor.element_size()
        infos.append(tierd_pb2.TensorInfo(name=name, dtype=to_safetensors(tensor.dtype),
                                          shape=list(tensor.shape), offset=offset, size=size))
        offset += -(-size // _TENSOR_ALIGNMENT) * _TENSOR_ALIGNMENT
    end = max((info.offset + info.size for info in infos), default=0)
    return infos, end
