"""The CUDA backend's handles, opened in this process through the CUDA driver API (libcuda, which
every CUDA process has loaded): slabs are IPC-opened device memory viewed as CUDA tensors without a
copy, events are IPC-opened CUDA events that streams wait on and record. PyTorch owns the device's
primary context; these calls run in it.

A handle is opened once per process: slabs and events are cached by their handle bytes for as long
as anything (a tensor view included) still refers to them, and closed after.
"""

import ctypes
import threading
import weakref

import torch

from . import _wire_format
from .errors import TierdError, StatusCode

_IPC_HANDLE_BYTES = _wire_format.CUDA_IPC_HANDLE_BYTES
_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
_CUDA_ERROR_NOT_READY = 600  # cuEventQuery: recorded work still running
_STREAMS_KEPT = 64
# The current stream's raw handle in one call (what Triton asks torch for); absent from some torch
# releases, where current_stream() asks torch for the stream object each time.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _IPC_HANDLE_BYTES)]


class _Driver:
    """ctypes bindings of the driver calls tierd's handles need."""

    _lock = threading.Lock()
    _instance = None

    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise TierdError(StatusCode.FAILED_PRECONDITION,
                             f"the daemon's backend is cuda, but libcuda.so.1 is missing: {error}")
        self._lib = lib
        # The same library through PyDLL: its calls keep the GIL. Used only for the calls that
        # change this thread's current context, which never block: each call made through `lib`
        # lets go of the GIL and must take it back, and on a fetch path with a session's reader
        # thread waiting for it, that handoff costs more than the call.
        self._lib_holding_gil = ctypes.PyDLL("libcuda.so.1")
        void_p = ctypes.c_void_p
        self._bind("cuGetErrorString", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])
        self._bind("cuDeviceGet", [ctypes.POINTER(ctypes.c_int), ctypes.c_int])
        self._bind("cuDevicePrimaryCtxRetain", [ctypes.POINTER(void_p), ctypes.c_int])
        self._bind("cuCtxPushCurrent_v2", [void_p], holding_gil=True)
        self._bind("cuCtxPopCurrent_v2", [ctypes.POINTER(void_p)], holding_gil=True)
        self._bind("cuIpcOpenMemHandle_v2",
                   [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint])
        self._bind("cuIpcCloseMemHandle", [ctypes.c_uint64])
        self._bind("cuIpcOpenEventHandle", [ctypes.POINTER(void_p), _IpcHandle])
        self._bind("cuEventDestroy_v2", [void_p])
        self._bind("cuEventRecord", [void_p, void_p])
        self._bind("cuEventQuery", [void_p])
        self._bind("cuEventSynchronize", [void_p])
        self._bind("cuStreamWaitEvent", [void_p, void_p, ctypes.c_uint])
        self._contexts = {}

    def _bind(self, name, argtypes, holding_gil=False):
        function = getattr(self._lib_holding_gil if holding_gil else self._lib, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
        setattr(self, name, function)

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._instance is None:
                cls._instance = _Driver()
            return cls._instance

    def check(self, result, what):
        if result != 0:
            message = ctypes.c_char_p()
            self.cuGetErrorString(result, ctypes.byref(message))
            text = message.value.decode() if message.value else f"error {result}"
            raise TierdError(StatusCode.INTERNAL, f"{what}: {text}")

    def context(self, ordinal):
        """The device's primary context (the one PyTorch uses), retained once."""
        with self._lock:
            context = self._contexts.get(ordinal)
            if context is None:
                device = ctypes.c_int()
                self.check(self.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
                context = ctypes.c_void_p()
                self.check(self.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
                           "cuDevicePrimaryCtxRetain")
                self._contexts[ordinal] = context
            return context


class _InContext:
    """Makes the device's primary context current for the calls inside."""

    def __init__(self, driver, ordinal):
        self._driver = driver
        self._context = driver.context(ordinal)

    def __enter__(self):
        self._driver.check(self._driver.cuCtxPushCurrent_v2(self._context), "cuCtxPushCurrent")

    def __exit__(self, *exc):
        popped = ctypes.c_void_p()
        self._driver.cuCtxPopCurrent_v2(ctypes.byref(popped))


def _ipc_handle(raw):
    if len(raw) != _IPC_HANDLE_BYTES:
        raise TierdError(StatusCode.INVALID_ARGUMENT, "CUDA IPC handle of the wrong size")
    handle = _IpcHandle()
    ctypes.memmove(ctypes.byref(handle), raw, _IPC_HANDLE_BYTES)
    return handle


class _DeviceMapping:
    """An IPC-opened slab's device memory, closed when the last tensor viewing it is gone (a tensor
    made from it keeps it alive through `__cuda_array_interface__`)."""

    def __init__(self, driver, ordinal, size, ipc):
        self.size = size
        if self.size == 0:
            raise TierdError(StatusCode.INVALID_ARGUMENT, "CUDA slab handle of size 0")
        pointer = ctypes.c_uint64()
        with _InContext(driver, ordinal):
            driver.check(driver.cuIpcOpenMemHandle_v2(ctypes.byref(pointer), _ipc_handle(ipc),
                                                      _IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                         "cuIpcOpenMemHandle")
        self._pointer = pointer.value
        self._close = (driver, ordinal)
        self.__cuda_array_interface__ = {
            "shape": (self.size,), "typestr": "|u1", "data": (self._pointer, False), "version": 2}

    def __del__(self):
        driver, ordinal = getattr(self, "_close", (None, None))
        if driver is not None:
            with _InContext(driver, ordinal):
                driver.cuIpcCloseMemHandle(self._pointer)


class CudaSlab:
    """A slab as a uint8 CUDA tensor over all of it (zero-copy)."""

    def __init__(self, mapping, ordinal):
        self.size = mapping.size
        self.tensor = torch.as_tensor(mapping, device=torch.device("cuda", ordinal))


class CudaEvent:
    def __init__(self, driver, ordinal, raw):
        event = ctypes.c_void_p()
        with _InContext(driver, ordinal):
            driver.check(driver.cuIpcOpenEventHandle(ctypes.byref(event), _ipc_handle(raw)),
                         "cuIpcOpenEventHandle")
        self.handle = event
        self._close = (driver, ordinal)

    def __del__(self):
        driver, ordinal = getattr(self, "_close", (None, None))
        if driver is not None:
            with _InContext(driver, ordinal):
                driver.cuEventDestroy_v2(self.handle)


class CudaBackend:
    """Opens CUDA handles (once per process) and runs event operations on torch streams."""

    name = "cuda"
    # One cache per process, shared by every client: CUDA opens a given IPC handle once per process.
    _cache_lock = threading.Lock()
    _cache = weakref.WeakValueDictionary()

    def __init__(self, ordinal):
        if not torch.cuda.is_available():
            raise TierdError(StatusCode.FAILED_PRECONDITION,
                             "the daemon's backend is cuda, but this process sees no GPU")
        torch.cuda.init()
        self.ordinal = ordinal
        self._driver = _Driver.get()
        self._streams = {}  # raw handle -> torch stream (current_stream)

    @property
    def device(self):
        return torch.device("cuda", self.ordinal)

    def _cached(self, raw, make):
        # Weak: what is opened stays open while a session or a tensor still refers to it.
        key = (self.ordinal, raw)
        with self._cache_lock:
            opened = self._cache.get(key)
            if opened is None:
                opened = make()
                self._cache[key] = opened
            return opened

    def open_slab(self, handle):
        size, ipc = _wire_format.parse_cuda_slab_handle(handle)
        mapping = self._cached(bytes(handle),
                               lambda: _DeviceMapping(self._driver, self.ordinal, size, ipc))
        return CudaSlab(mapping, self.ordinal)

    def open_event(self, handle):
        raw = _wire_format.parse_cuda_event_handle(handle)
        return self._cached(bytes(handle), lambda: CudaEvent(self._driver, self.ordinal, raw))

    def current_stream(self):
        """torch's current stream on the device. Asked for on every fetch and release, so the
        stream object is kept by its handle: a stream is a handle and a device, and the streams
        torch hands out live as long as the process."""
        if _current_raw_stream is None:
            return torch.cuda.current_stream(self.ordinal)
        handle = _current_raw_stream(self.ordinal)
        stream = self._streams.get(handle)
        if stream is None:
            stream = torch.cuda.current_stream(self.ordinal)
            if len(self._streams) >= _STREAMS_KEPT:
                self._streams.clear()
            self._streams[stream.cuda_stream] = stream
        return stream

    def wait_event(self, event, stream):
        """Makes `stream` wait for the event's newest record; the CPU does not wait."""
        with _InContext(self._driver, self.ordinal):
            self._driver.check(
                self._driver.cuStreamWaitEvent(ctypes.c_void_p(stream.cuda_stream), event.handle,
                                               0), "cuStreamWaitEvent")

    def record_event(self, event, stream):
        with _InContext(self._driver, self.ordinal):
            self._driver.check(
                self._driver.cuEventRecord(event.handle, ctypes.c_void_p(stream.cuda_stream)),
                "cuEventRecord")

    def query_event(self, event):
        """Whether the event's newest record has completed."""
        with _InContext(self._driver, self.ordinal):
            result = self._driver.cuEventQuery(event.handle)
        if result == _CUDA_ERROR_NOT_READY:
            return False
        self._driver.check(result, "cuEventQuery")
        return True

    def synchronize_event(self, event):
        with _InContext(self._driver, self.ordinal):
            self._driver.check(self._driver.cuEventSynchronize(event.handle), "cuEventSynchronize")

    def synchronize_stream(self, stream):
        stream.synchronize()

    def stream_idle(self, stream):
        """Whether all work enqueued on `stream` has completed (the stream's own query: no
        interprocess state)."""
        return stream.query()

    def stream_key(self, stream):
        """Streams are told apart by their CUDA handle: torch's pooled streams live as long as
        the process, so a handle is never another stream's."""
        return stream.cuda_stream

    def on_stream(self, stream):
        """A context in which torch enqueues on `stream`."""
        return torch.cuda.stream(stream)

    def copy_into(self, destination, source, stream):
        with torch.cuda.stream(stream):
            destination.copy_(source, non_blocking=True)
        if source.is_cuda and stream != torch.cuda.current_stream(source.device):
            # The caching allocator must not hand the source's memory out before this copy ran.
            source.record_stream(stream)
