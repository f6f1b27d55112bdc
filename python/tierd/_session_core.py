"""The request/answer core of a Python session, the counterpart of the C++ wire/session_core.h:
request ids, the requests awaiting answers, the reader thread that matches answers to them, and the
slab and event handles the daemon sent, opened in this process on first use. Session builds the
data path on it."""

import logging
import threading

from .errors import StatusCode, TierdError, code_from_number
from .v1 import tierd_pb2

_log = logging.getLogger("tierd")


class _Pending:
    __slots__ = ("event", "response", "callback")

    def __init__(self, callback=None):
        self.event = threading.Event() if callback is None else None
        self.response = None
        self.callback = callback


class SessionCore:
    """The request/answer half of a Session, over `transport` (tierd._transport). The subclass
    sets `_backend` (which opens handles) before it uses a handle, and may override
    _session_ended_locked. Thread-safe."""

    def __init__(self, transport, timeout):
        self._transport = transport
        self._timeout = timeout
        self._lock = threading.Lock()
        self._next_request = 1
        self._pending = {}
        self._ended = None  # the TierdError every later call gets, once the stream ended
        self._handles_lock = threading.Lock()
        self._slabs = {}
        self._events = {}
        self._handle_bytes = {}
        self._backend = None
        self._reader = threading.Thread(target=self._read_loop, name="tierd-session", daemon=True)

    def _start_reading(self):
        self._reader.start()

    def _session_ended_locked(self):
        """Called once, under `_lock`, when the stream has ended and `_ended` is set."""

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

    def _send_many(self, quiet, requests, callbacks):
        """Sends the `quiet` requests and then `requests` in one write, `callbacks[i]` taking the
        answer to requests[i] as _send's callback does."""
        with self._lock:
            if self._ended is not None:
                raise self._ended
            for request in quiet:
                request.request_id = self._next_request
                self._next_request += 1
            for request, callback in zip(requests, callbacks):
                request.request_id = self._next_request
                self._next_request += 1
                self._pending[request.request_id] = _Pending(callback)
        self._transport.send_many(list(quiet) + list(requests))

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
            self._session_ended_locked()
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
