"""The Python client's wire formats are those proto/tierd/v1/wire.proto defines (the C++ side's
wire_format_test checks the daemon's against the same definition): the session socket's greeting
and frame limit, and the slab and event handles, parsed from bytes laid out as the proto says and
from what a real daemon sends."""

import struct
import unittest

import torch

import tierd
from tierd import _transport, _wire_format
from tierd.v1 import tierd_pb2, wire_pb2
from tierd_testing import TEST_DEVICE, DaemonTestCase, torch_device

SOCKET = wire_pb2.SessionSocketFormat()
HANDLES = wire_pb2.HandleFormats()


class DefinedOnceTest(unittest.TestCase):
    def test_the_session_socket_speaks_the_proto_greeting_and_limit(self):
        self.assertEqual(SOCKET.hello, "tierd.v1.Session\n")  # what older daemons speak
        self.assertEqual(_transport.SESSION_SOCKET_HELLO, SOCKET.hello.encode())
        self.assertEqual(_transport.MAX_FRAME_BYTES, SOCKET.max_frame_bytes)
        self.assertEqual(_wire_format.FRAME_LENGTH.pack(1), b"\x01\x00\x00\x00")

    def test_a_cuda_slab_handle_is_prefix_size_and_ipc_handle(self):
        ipc = bytes(range(HANDLES.cuda_ipc_handle_bytes))
        handle = HANDLES.cuda_slab_prefix.encode() + struct.pack("<Q", 3 << 20) + ipc
        self.assertEqual(_wire_format.parse_cuda_slab_handle(handle), (3 << 20, ipc))
        for wrong in (handle[:-1], handle + b"x", HANDLES.host_slab_prefix.encode() + handle[16:]):
            with self.assertRaises(tierd.TierdError) as raised:
                _wire_format.parse_cuda_slab_handle(wrong)
            self.assertEqual(raised.exception.code, tierd.StatusCode.INVALID_ARGUMENT)

    def test_a_cuda_event_handle_is_prefix_and_ipc_handle(self):
        ipc = bytes(reversed(range(HANDLES.cuda_ipc_handle_bytes)))
        handle = HANDLES.cuda_event_prefix.encode() + ipc
        self.assertEqual(_wire_format.parse_cuda_event_handle(handle), ipc)
        with self.assertRaises(tierd.TierdError):
            _wire_format.parse_cuda_event_handle(HANDLES.cuda_slab_prefix.encode() + ipc)

    def test_a_host_slab_handle_is_prefix_and_shared_memory_name(self):
        handle = (HANDLES.host_slab_prefix + "/tierd.1.ab.slab.0").encode()
        self.assertEqual(_wire_format.parse_host_slab_handle(handle), "/tierd.1.ab.slab.0")
        with self.assertRaises(tierd.TierdError):
            _wire_format.parse_host_slab_handle(b"tierd-host-event:/tierd.1.ab.slab.0")

    def test_a_host_event_handle_is_prefix_table_separator_and_slot(self):
        separator = HANDLES.host_event_slot_separator
        handle = f"{HANDLES.host_event_prefix}/tierd.1.ab.events.0{separator}17".encode()
        self.assertEqual(_wire_format.parse_host_event_handle(handle), ("/tierd.1.ab.events.0", 17))
        for wrong in (handle[:-2], handle + b"x", (HANDLES.host_slab_prefix + "/t:1").encode()):
            with self.assertRaises(tierd.TierdError):
                _wire_format.parse_host_event_handle(wrong)


class DaemonHandlesTest(DaemonTestCase):
    """The handles a real daemon sends have the layout the proto defines."""

    def test_the_daemons_handles_parse_as_the_proto_defines(self):
        with self.client.session() as session:
            self.assertEqual(session.transport, "socket")  # the greetings matched
            tensor = torch.arange(64, dtype=torch.float32, device=torch_device())
            session.store_async("acts/wire", tensor)
            session.flush()
            handles = dict(session._handle_bytes)
        kinds = {kind for kind, _ in handles}
        self.assertEqual(kinds, {tierd_pb2.Handle.SLAB, tierd_pb2.Handle.EVENT})
        for (kind, handle_id), handle in handles.items():
            if TEST_DEVICE.startswith("cuda"):
                if kind == tierd_pb2.Handle.SLAB:
                    size, ipc = _wire_format.parse_cuda_slab_handle(handle)
                    self.assertGreater(size, 0)
                else:
                    ipc = _wire_format.parse_cuda_event_handle(handle)
                self.assertEqual(len(ipc), HANDLES.cuda_ipc_handle_bytes)
            elif kind == tierd_pb2.Handle.SLAB:
                self.assertTrue(handle.startswith(HANDLES.host_slab_prefix.encode()), handle)
                self.assertTrue(_wire_format.parse_host_slab_handle(handle).startswith("/tierd."))
            else:
                self.assertTrue(handle.startswith(HANDLES.host_event_prefix.encode()), handle)
                name, _ = _wire_format.parse_host_event_handle(handle)
                self.assertTrue(name.startswith("/tierd."), handle)


if __name__ == "__main__":
    unittest.main()
