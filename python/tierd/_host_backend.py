"""The host backend's handles, opened in this process: slabs are POSIX shared memory mapped as
CPU tensors, events are futex-backed counters in shared memory (device/shared_event.h), reached
through the small C helper built beside this module.

CPU work has no stream: a tensor op is finished when it returns, so recording an event completes
it at once and waiting on one blocks the calling thread (on a futex, not a spin).
"""

import contextlib
import ctypes
import mmap
import os
import threading
import weakref

import torch

from . import _wire_format
from .errors import TierdError, StatusCode

_EVENT_BYTES = 64
_SHM_DIR = "/dev/shm"
# A wait on a ready event longer than this means the daemon is stuck; say so instead of hanging.
_WAIT_TIMEOUT_NS = 60 * 10**9


def _check_object_name(name):
    # Only objects tierd named may be opened: a handle is input from another process.
    if not name.startswith("/tierd.") or "/" in name[1:] or ".." in name:
        raise TierdError(StatusCode.INVALID_ARGUMENT, f"not a tierd shared memory name: {name!r}")


def _map_shared_memory(name):
    _check_object_name(name)
    try:
        fd = os.open(_SHM_DIR + name, os.O_RDWR)
    except FileNotFoundError:
        raise TierdError(StatusCode.NOT_FOUND, f"shared memory {name} is gone") from None
    except PermissionError:
        raise TierdError(StatusCode.PERMISSION_DENIED, f"shared memory {name}") from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise TierdError(StatusCode.INVALID_ARGUMENT, f"shared memory {name} is empty")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


class _Helper:
    """ctypes bindings of libtierd_host_event.so, loaded on first use."""

    _lock = threading.Lock()
    _lib = None

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._lib is None:
                path = os.path.join(os.path.dirname(__file__), "libtierd_host_event.so")
                try:
                    lib = ctypes.CDLL(path)
                except OSError as error:
                    raise TierdError(StatusCode.FAILED_PRECONDITION,
                                     f"the host backend needs {path}: {error}") from None
                lib.tierd_host_event_record.argtypes = [ctypes.c_void_p]
                lib.tierd_host_event_record.restype = ctypes.c_uint64
                lib.tierd_host_event_wait.argtypes = [ctypes.c_void_p, ctypes.c_int64]
                lib.tierd_host_event_wait.restype = ctypes.c_int
                lib.tierd_host_event_size.restype = ctypes.c_uint64
                if lib.tierd_host_event_size() != _EVENT_BYTES:
                    raise TierdError(StatusCode.FAILED_PRECONDITION,
                                     "libtierd_host_event.so does not match this client")
                cls._lib = lib
            return cls._lib


class HostSlab:
    """A mapped slab; `tensor` is a uint8 CPU tensor over all of it (zero-copy)."""

    def __init__(self, name):
        self._memory = _map_shared_memory(name)
        self.tensor = torch.frombuffer(self._memory, dtype=torch.uint8)
        self.size = len(self._memory)


class _EventTable:
    def __init__(self, name):
        self.memory = _map_shared_memory(name)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.memory))


class HostEvent:
    def __init__(self, table, slot):
        if (slot + 1) * _EVENT_BYTES > len(table.memory):
            raise TierdError(StatusCode.INVALID_ARGUMENT, f"event slot {slot} is outside its table")
        self._table = table  # keeps the mapping alive
        self._address = table.base + slot * _EVENT_BYTES


class HostBackend:
    """Opens host handles and runs event operations for CPU tensors."""

    name = "host"

    def __init__(self):
        self._lock = threading.Lock()
        self._tables = weakref.WeakValueDictionary()

    @property
    def device(self):
        return torch.device("cpu")

    def open_slab(self, handle):
        return HostSlab(_wire_format.parse_host_slab_handle(handle))

    def open_event(self, handle):
        name, slot = _wire_format.parse_host_event_handle(handle)
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                table = _EventTable(name)
                self._tables[name] = table
        return HostEvent(table, slot)

    def current_stream(self):
        return None

    def wait_event(self, event, stream):
        """Blocks until the event's newest record has completed (CPU tensors have no stream)."""
        del stream
        if not _Helper.get().tierd_host_event_wait(event._address, _WAIT_TIMEOUT_NS):
            raise TierdError(StatusCode.DEADLINE_EXCEEDED,
                             "the daemon's copy did not complete within 60 s")

    def record_event(self, event, stream):
        """The caller's CPU work is finished: record and complete at once."""
        del stream
        _Helper.get().tierd_host_event_record(event._address)

    def query_event(self, event):
        """This client's records complete at once (record_event)."""
        del event
        return True

    def synchronize_event(self, event):
        self.wait_event(event, None)

    def synchronize_stream(self, stream):
        """CPU work has no stream: it is finished when it returns."""
        del stream

    def stream_key(self, stream):
        del stream
        return "cpu"

    def stream_idle(self, stream):
        """CPU work is finished when it returns: a release after it needs no event."""
        del stream
        return True

    def on_stream(self, stream):
        """CPU work has no stream: nothing to switch to."""
        del stream
        return contextlib.nullcontext()

    def copy_into(self, destination, source, stream):
        del stream
        destination.copy_(source)
