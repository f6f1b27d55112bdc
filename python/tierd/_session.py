"""A session with the daemon: `Session` for the data path, `Lease` for a fetched object's tensors,
`PendingFetch` for a fetch not yet taken (the lease protocol, proto/tierd/v1/tierd.proto). The
request/answer machinery beneath is tierd._session_core."""

import collections
import logging
import threading
import time

import torch

from ._done_events import DoneEvents
from ._lease_views import LeaseViews
from ._session_core import SessionCore
from ._wire_format import SESSION_PROTOCOL
from .dtypes import ELEMENT_BYTES, to_safetensors, to_torch
from .errors import StatusCode, TierdError, code_from_number
from .v1 import tierd_pb2

_log = logging.getLogger("tierd")

# Tensors of a stored object start at multiples of this, as the daemon lays out gathered objects
# (storage/model/object_layout.h): a tensor's device address is as aligned as its own allocation's.
_TENSOR_ALIGNMENT = 256

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
    viewed in place and is copied instead, with a warning."""
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


def _staging_views(slab, offset, length, infos, backend, stream):
    """(buffer, tensor_views, whether every tensor views the buffer rather than copies it) of
    `length` bytes at `offset` of `slab`; a copy is made on `stream`, after what it waits for."""
    buffer = slab.tensor[offset: offset + length]
    with backend.on_stream(stream):
        views = tensor_views(buffer, infos)
    start, end = buffer.data_ptr(), buffer.data_ptr() + length
    in_place = all(view.numel() == 0 or start <= view.data_ptr() < end for view in views.values())
    return buffer, views, in_place


class Lease:
    """A fetched object held in a staging buffer until released.

    `tensors` maps each tensor's name to a view of the buffer; `buffer` is all of the object's
    bytes as uint8. They are valid until release(): the daemon may then reuse the memory for
    another object. `resident`: the bytes were in the daemon's GPU staging already when it
    answered (no copy to wait for). A context manager releases on exit.
    """

    def __init__(self, session, key, lease_id, buffer, tensors, resident=False):
        self.key = key
        self.lease_id = lease_id
        self.buffer = buffer
        self.tensors = tensors
        self.resident = resident
        self._session = session
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
        """Records one of the session's done events on `stream` (default: the current stream)
        after everything the caller has enqueued that reads the buffer, and releases the lease.
        Idempotent."""
        if self._detach():
            self._session._release(self.lease_id, stream)

    def _detach(self):
        """Marks the lease released; False when it was already."""
        if self._released:
            return False
        self._released = True
        self.tensors = {}
        self.buffer = None
        return True

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


class RetainedSet(collections.namedtuple(
        "RetainedSet", "target objects bytes ttl asleep idle moved")):
    """A retained set as the daemon reports it: ttl and idle in seconds (ttl None: none)."""

    @classmethod
    def from_proto(cls, message):
        return cls(message.target, message.objects, message.bytes,
                   message.ttl_ms / 1000 if message.ttl_ms else None, message.asleep,
                   message.idle_ms / 1000, message.moved)


class Session(SessionCore):
    """A session with the daemon: fetches, prefetches, stores, pins. Leases and pins belong to the
    session; closing it (or the process exiting) releases them. Thread-safe."""

    def __init__(self, client, transport, device):
        super().__init__(transport, client.timeout)
        self._client = client
        self._commits = collections.Counter()  # key -> commits in flight
        self._commit_error = None
        self._commits_changed = threading.Condition(self._lock)
        self._lease_views = LeaseViews(_staging_views)
        self._start_reading()
        request = tierd_pb2.SessionRequest()
        request.open.client_name = client.client_name
        request.open.protocol = SESSION_PROTOCOL
        self.info = self._call(request).opened
        try:
            if self.info.protocol != SESSION_PROTOCOL:
                raise TierdError(StatusCode.FAILED_PRECONDITION,
                                 f"the daemon speaks session protocol {self.info.protocol}, this "
                                 f"client {SESSION_PROTOCOL}: use the client of the daemon's release")
            self._backend = _backend_for(self.info, device)
            self._done_events = DoneEvents(
                self._backend, [(event_id, self._event(event_id))
                                for event_id in self.info.done_event_ids])
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

    def fetch_many_async(self, keys, release=(), stream=None):
        """One write for a step: releases the Leases in `release` (done events recorded on
        `stream`, default the current stream, as Lease.release does) and sends a fetch of each of
        `keys`, releases first. Returns a PendingFetch per key, in order."""
        keys = list(keys)
        for key in keys:
            self._wait_for_commits_of(key)
        mine = []
        for lease in release:
            if lease._session is not self:
                lease.release(stream)  # another session's: released through it
            elif lease._detach():
                mine.append(lease.lease_id)
        releases = self._release_requests(mine, stream)
        pending = [PendingFetch(self, key) for key in keys]
        fetches = []
        for key in keys:
            request = tierd_pb2.SessionRequest()
            request.fetch.key = key
            fetches.append(request)
        if not releases and not fetches:
            return pending
        try:
            self._send_many(releases, fetches, [fetch._answer for fetch in pending])
        except TierdError:
            if fetches:
                raise
            # Only releases, and the session ended: the daemon released everything it held.
        return pending

    def fetch_many(self, keys, release=(), stream=None):
        """fetch_many_async, then the leases of `keys` in order, `stream` made to wait for each
        one's bytes: one round trip for a step. When a fetch fails, the leases of the others are
        released and its error is raised, naming its key."""
        pending = self.fetch_many_async(keys, release, stream)
        leases = []
        try:
            for fetch in pending:
                try:
                    leases.append(fetch.result(stream))
                except TierdError as error:
                    raise TierdError(error.code, f"{fetch.key}: {error.message}") from None
        except BaseException:
            self.release_many(leases, stream)
            for fetch in pending[len(leases):]:
                fetch.cancel()
            raise
        return leases

    def release_many(self, leases, stream=None):
        """Releases `leases` (done events recorded on `stream`) in one write."""
        self.fetch_many_async((), leases, stream)

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
        stream), records a done event there and sends the commit, without waiting for the
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
            buffer = slab.tensor[reservation.offset: reservation.offset + reservation.length]
            views = tensor_views(buffer, infos)
            for info, source in zip(infos, named.values()):
                self._backend.copy_into(views[info.name], source, stream)
            written = self._done_events.record_after(stream)
            if written is not None:
                commit.commit.written_event_id = written
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

    # ---- retained sets (docs/CLIENTS.md, "Retained weights") ----------------------------------

    def retain(self, target, ttl=None):
        """Keeps `target` on the GPU beyond this session, in this session's client group: a model's
        name (every object of it), "NAMESPACE/" (the stored objects under it, as they are now) or
        one key. Returns once the whole set is on the GPU, as a RetainedSet. `ttl` (seconds): the
        set is released once that long has passed since its last lease ended; None keeps it until
        unretain(). Retaining a set again sets its ttl. Raises TierdError: NOT_FOUND,
        RESOURCE_EXHAUSTED (past the group's --retain-bytes, or the pool is full),
        FAILED_PRECONDITION (the set is asleep), the loads' errors."""
        request = tierd_pb2.SessionRequest()
        request.retain.target = target
        if ttl is not None:
            if ttl <= 0:
                raise ValueError("ttl must be a positive number of seconds, or None")
            request.retain.ttl_ms = max(1, round(ttl * 1000))
        return RetainedSet.from_proto(self._call(request).retained)

    def unretain(self, target):
        """Lets a retained set go: its objects become evictable (leases keep theirs)."""
        request = tierd_pb2.SessionRequest()
        request.unretain.target = target
        self._call(request)

    def sleep(self, target):
        """Gives a retained set's GPU memory back to the daemon's pool; its bytes stay in the host
        tier. Refused (FAILED_PRECONDITION) while any process leases one of its objects."""
        request = tierd_pb2.SessionRequest()
        request.sleep.target = target
        return RetainedSet.from_proto(self._call(request).retained)

    def wake(self, target):
        """Brings a sleeping set back to the GPU, each object at the device address it had where
        that room is free (RetainedSet.moved counts the others). Returns the RetainedSet."""
        request = tierd_pb2.SessionRequest()
        request.wake.target = target
        return RetainedSet.from_proto(self._call(request).retained)

    def retained(self):
        """This group's retained sets: (list of RetainedSet, bytes on the GPU, budget bytes)."""
        request = tierd_pb2.SessionRequest()
        request.list_retained.SetInParent()
        listed = self._call(request).retained_sets
        return [RetainedSet.from_proto(s) for s in listed.sets], listed.bytes, listed.budget_bytes

    def close(self):
        """Ends the session: the daemon releases whatever it still holds for it."""
        self._transport.close()
        if threading.current_thread() is not self._reader:
            self._reader.join()
        self._lease_views.clear()

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
        try:
            stream = self._stream(stream)
            if lease.HasField("ready_event_id"):
                # The copy into staging may still run: the stream waits for it, before anything
                # below can read the buffer (a misaligned tensor is copied out of it).
                self._backend.wait_event(self._event(lease.ready_event_id), stream)
            buffer, tensors = self._lease_views.views(lease.slab_id, self._slab(lease.slab_id),
                                                      lease.offset, lease.length, lease.tensors,
                                                      self._backend, stream)
        except BaseException:
            self._release(lease.lease_id, None, read=False)
            raise
        return Lease(self, lease.key, lease.lease_id, buffer, tensors,
                     resident=not lease.HasField("ready_event_id"))

    def _release(self, lease_id, stream, read=True):
        """Records a done event on `stream` after the caller's reads (unless nothing of ours
        `read` the buffer) and sends the release without waiting for an answer. Once the session
        has ended it does nothing: the daemon released the lease, and the session's events may be
        another's by now."""
        for request in self._release_requests([lease_id], stream, read):
            self._send_quiet(request)

    def _release_requests(self, lease_ids, stream, read=True):
        """The quiet releases of `lease_ids`, all naming one done event recorded on `stream` after
        the caller's reads (unless nothing of ours `read` the buffers); none once the session has
        ended."""
        if self._ended is not None or not lease_ids:
            return []
        done = self._done_events.record_after(self._stream(stream)) if read else None
        requests = []
        for lease_id in lease_ids:
            request = tierd_pb2.SessionRequest()
            request.release.lease_id = lease_id
            request.release.quiet = True
            if done is not None:
                request.release.done_event_id = done
            requests.append(request)
        return requests

    def _release_unread(self, response):
        # A cancelled fetch's answer: may run on the reader thread, so it only sends.
        if response.code == 0:
            self._release(response.lease.lease_id, None, read=False)

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

    def _session_ended_locked(self):
        self._commits_changed.notify_all()


def retain_as_asked(session, target, retain):
    """Retains `target` through `session` when a `retain=` option asks it — True: until released;
    a number: released after that many seconds of disuse; None or False: not — and returns
    whether it did."""
    if retain is None or retain is False:
        return False
    session.retain(target, ttl=None if retain is True else retain)
    return True


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
