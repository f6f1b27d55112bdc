"""The Python client against a real daemon: fetch, store and release round trips, the activation
cache calls, errors, both transports, and a killed client's leases."""

import grp
import os
import shutil
import signal
import tempfile
import time
import unittest

import grpc
import torch

import tierd
import tierd.v1.tierd_pb2
from dit_model import save_safetensors
from tierd_testing import (TIMEOUT, Daemon, DaemonTestCase, run_python, synchronize,
                           torch_device)

BLOCKS = 6


def model_tensors(seed):
    """Per block: an F32 and a BF16 weight and an I64 index tensor (odd sizes on purpose)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for block in range(BLOCKS):
        tensors[f"blocks.{block}.attn.qkv.weight"] = torch.randn(96, 256, generator=generator)
        tensors[f"blocks.{block}.ffn.up.weight"] = torch.randn(
            130, 77, generator=generator).to(torch.bfloat16)
        tensors[f"blocks.{block}.ffn.index"] = torch.randint(0, 1 << 40, (33,),
                                                             generator=generator)
    tensors["head.weight"] = torch.randn(16, 96, generator=generator)
    return tensors


class ClientTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.tensors = model_tensors(seed=7)
        save_safetensors(self.tensors, os.path.join(self.model_dir("model"), "model.safetensors"))
        progress = []
        summary = self.client.register_model("m", self.model_dir("model"),
                                             progress=lambda *args: progress.append(args))
        self.assertEqual(summary.objects, BLOCKS + 1)
        self.assertEqual(progress[-1][:2], (1, 1))

    def assert_lease_holds(self, lease, names):
        self.assertEqual(sorted(lease.tensors), sorted(names))
        for name in names:
            fetched = lease.tensors[name]
            self.assertEqual(fetched.device.type, torch_device().type)
            self.assertTrue(torch.equal(fetched.cpu(), self.tensors[name]), name)
            # A view of the staging buffer, not a copy.
            start = lease.buffer.data_ptr()
            self.assertTrue(start <= fetched.data_ptr() < start + lease.buffer.numel(), name)

    def block_names(self, block):
        return [name for name in self.tensors if name.startswith(f"blocks.{block}.")]

    def test_list_objects_describes_the_model(self):
        objects = {info.key: info for info in self.client.list_objects("m")}
        self.assertEqual(sorted(objects), sorted([f"m/blocks.{b}" for b in range(BLOCKS)] +
                                                 ["m/head.weight"]))
        self.assertEqual(sorted(t.name for t in objects["m/blocks.2"].tensors),
                         sorted(self.block_names(2)))
        self.assertEqual([m.name for m in self.client.list_models()], ["m"])

    def test_a_relative_model_directory_is_the_callers(self):
        previous = os.getcwd()
        os.chdir(self.directory)
        try:
            summary = self.client.register_model("relative", "model")
        finally:
            os.chdir(previous)
        self.assertEqual(summary.directory, self.model_dir("model"))
        # The daemon itself refuses a relative path: it would resolve it against its own directory.
        with self.assertRaises(grpc.RpcError) as caught:
            list(self.client._stub.RegisterModel(
                tierd.v1.tierd_pb2.RegisterModelRequest(name="raw", directory="model")))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("absolute", caught.exception.details())

    def test_fetch_views_the_files_tensors(self):
        with self.client.session() as session:
            self.assertEqual(session.transport, "socket")
            for block in range(BLOCKS):
                with session.fetch(f"m/blocks.{block}") as lease:
                    self.assert_lease_holds(lease, self.block_names(block))
                self.assertTrue(lease.released)
            self.wait_for_stats(lambda stats: stats.leases == 0, "every lease released")

    def test_prefetch_then_fetch_hits_the_gpu_copy(self):
        with self.client.session() as session:
            session.prefetch(["m/blocks.1", "m/blocks.2"])
            deadline = time.monotonic() + TIMEOUT
            while not all(info.on_gpu for info in self.client.list_objects("m")
                          if info.key in ("m/blocks.1", "m/blocks.2")):
                self.assertLess(time.monotonic(), deadline, "the prefetch never landed")
                time.sleep(0.02)
            hits = self.client.stats().gpu.hits
            with session.fetch("m/blocks.2") as lease:
                self.assert_lease_holds(lease, self.block_names(2))
            self.assertEqual(self.client.stats().gpu.hits, hits + 1)

    def test_the_grpc_stream_serves_the_same(self):
        client = tierd.Client(self.daemon.socket, session_socket="")
        with client.session() as session:
            self.assertEqual(session.transport, "grpc")
            with session.fetch("m/blocks.3") as lease:
                self.assert_lease_holds(lease, self.block_names(3))
            session.store_async("acts/x", torch.arange(1000, device=torch_device()))
            session.flush()
            with session.fetch("acts/x") as lease:
                self.assertTrue(torch.equal(lease.tensor.cpu(), torch.arange(1000)))
        client.close()

    def test_store_then_fetch_round_trips(self):
        device = torch_device()
        kv = torch.randn(4, 33, 16, device=device).to(torch.bfloat16)
        x = torch.randn(7, 5, device=device)
        with self.client.session() as session:
            session.store_async("acts/layer0", {"kv": kv, "x": x})
            session.flush()
            with session.fetch("acts/layer0") as lease:
                self.assertEqual(list(lease.tensors), ["kv", "x"])
                self.assertTrue(torch.equal(lease.tensors["kv"].cpu(), kv.cpu()))
                self.assertTrue(torch.equal(lease.tensors["x"].cpu(), x.cpu()))
            # A store replaces the key; the fetch waits for the commit without a flush.
            session.store_async("acts/layer0", {"kv": kv * 2})
            with session.fetch("acts/layer0") as lease:
                self.assertEqual(list(lease.tensors), ["kv"])
                self.assertTrue(torch.equal(lease.tensors["kv"].cpu(), (kv * 2).cpu()))
            self.assertEqual(self.client.stats().stored_objects, 1)

    def test_each_lease_gets_tensors_of_its_own_laid_out_as_stored_now(self):
        # An object that stays on the GPU is leased at the same place each time, and the session
        # keeps the views it made there: a caller's in-place changes to one lease's tensors must
        # not reach the next lease's, and the same bytes stored again under other shapes must be
        # seen under the new ones.
        device = torch_device()
        x = torch.arange(32, dtype=torch.float32, device=device).reshape(4, 8)
        with self.client.session() as session:
            session.store_async("acts/x", {"x": x, "y": x + 1})
            session.flush()
            with session.fetch("acts/x") as first:
                place = first.tensors["x"].data_ptr()
                first.tensors["x"].unsqueeze_(0)
                first.tensors["y"].requires_grad_()
            with session.fetch("acts/x") as second:
                self.assertEqual(second.tensors["x"].data_ptr(), place)
                self.assertEqual(tuple(second.tensors["x"].shape), (4, 8))
                self.assertFalse(second.tensors["y"].requires_grad)
                self.assertTrue(torch.equal(second.tensors["x"].cpu(), x.cpu()))
                self.assertTrue(torch.equal(second.tensors["y"].cpu(), (x + 1).cpu()))
            # Stores alternate between two staging ranges (each new version's, then the old one's
            # freed); three layouts in turn put each layout where another one was.
            shapes = [(8, 4), (2, 16), (4, 8)]
            for version in range(6):
                shape = shapes[version % 3]
                session.store_async("acts/x", {"x": x.reshape(shape) * version, "y": x[:2]})
                with session.fetch("acts/x") as lease:
                    self.assertEqual(tuple(lease.tensors["x"].shape), shape)
                    self.assertTrue(torch.equal(lease.tensors["x"].cpu(),
                                                (x.reshape(shape) * version).cpu()))
                    self.assertTrue(torch.equal(lease.tensors["y"].cpu(), x[:2].cpu()))

    def test_a_tensor_copied_for_its_alignment_is_never_another_objects(self):
        # A float32 tensor 3 bytes into its object cannot be viewed in place and is copied. Two
        # models of the same names and shapes, leased at the same place one after the other, have
        # the same layout there: the second must get its own bytes, not a copy of the first's.
        for model, scale in (("ma", 1.0), ("mb", -2.0)):
            save_safetensors({"blocks.0.a": torch.arange(3, dtype=torch.uint8),
                              "blocks.0.b": torch.arange(4, dtype=torch.float32) * scale},
                             os.path.join(self.model_dir(model), "model.safetensors"))
            self.client.register_model(model, self.model_dir(model))
        with self.client.session() as session:
            places = set()
            for model, scale in (("ma", 1.0), ("mb", -2.0), ("ma", 1.0)):
                with session.fetch(f"{model}/blocks.0") as lease:
                    places.add(lease.buffer.data_ptr())
                    self.assertTrue(torch.equal(lease.tensors["blocks.0.b"].cpu(),
                                                torch.arange(4, dtype=torch.float32) * scale),
                                    model)
                self.evict_once_copied(session, f"{model}/blocks.0")
            self.assertEqual(len(places), 1, "the objects were not leased at one place")

    def test_activation_cache_offloads_and_brings_back(self):
        device = torch_device()
        with self.client.session() as session:
            cache = tierd.ActivationCache(session, "jano")
            stored = {}
            for cond in ("cond", "uncond"):
                for layer in range(3):
                    for kind in ("s_kv", "m_x"):
                        key = f"{kind}_{cond}_{layer}"
                        stored[key] = torch.randn(2, 9 + layer, 8, device=device)
                        cache.store_async(stored[key], key)
            cache.flush()
            step = [f"s_kv_cond_{layer}" for layer in range(3)]
            for _ in range(2):  # two fetch steps: the second releases the first's buffers
                cache.begin_fetch_step(step)
                for key in step:
                    fetched = cache.fetch(key)
                    self.assertTrue(torch.equal(torch.cat([fetched]).cpu(), stored[key].cpu()), key)
                synchronize()
                # The previous step's releases went out quiet, and drain on their done events:
                # stats, on another connection, may see them still draining for a moment.
                self.wait_for_stats(lambda stats: stats.leases == len(step),
                                    "the step's leases, and no others")
            # A key the step did not name is fetched on demand.
            self.assertTrue(torch.equal(cache.fetch("m_x_uncond_2").cpu(), stored["m_x_uncond_2"].cpu()))
            cache.end_fetch_step()
            self.wait_for_stats(lambda stats: stats.leases == 0, "the step's leases released")

    def test_errors_name_the_problem(self):
        with self.client.session() as session:
            with self.assertRaises(tierd.TierdError) as caught:
                session.fetch("m/blocks.99")
            self.assertEqual(caught.exception.code, tierd.StatusCode.NOT_FOUND)
            with self.assertRaises(tierd.TierdError) as caught:
                session.store_async("m/mine", torch.ones(4, device=torch_device()))
            self.assertEqual(caught.exception.code, tierd.StatusCode.INVALID_ARGUMENT)
            self.assertIn("registered model", caught.exception.message)
            with self.assertRaises(tierd.TierdError) as caught:
                session.store_async("no-namespace", torch.ones(4, device=torch_device()))
            self.assertEqual(caught.exception.code, tierd.StatusCode.INVALID_ARGUMENT)
            with self.assertRaises(TypeError):
                session.store_async("acts/x", {"x": [1, 2, 3]})
            with self.assertRaises(ValueError):
                session.store_async("acts/x", torch.ones(0, device=torch_device()))
            # The session still serves after the failures.
            with session.fetch("m/blocks.0") as lease:
                self.assert_lease_holds(lease, self.block_names(0))
        with self.assertRaises(tierd.TierdError) as caught:
            self.client.register_model("other", os.path.join(self.directory, "missing"))
        self.assertEqual(caught.exception.code, tierd.StatusCode.NOT_FOUND)
        with self.assertRaises(ValueError):
            self.client.evict("m/", tier="disk")

    def test_a_killed_client_leaves_no_leases(self):
        holder = run_python(
            "import sys, time, tierd\n"
            "session = tierd.Client(sys.argv[1]).session()\n"
            "leases = [session.fetch(f'm/blocks.{b}') for b in range(2)]\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n", self.daemon.socket)
        try:
            self.assertEqual(holder.stdout.readline().strip(), "held", holder.stderr.read()
                             if holder.poll() is not None else "")
            self.assertEqual(self.client.stats().leases, 2)
            holder.send_signal(signal.SIGKILL)
        finally:
            holder.kill()
            holder.communicate()
        self.wait_for_stats(lambda stats: stats.leases == 0 and stats.sessions == 0,
                            "the killed client's session ending")
        with self.client.session() as session, session.fetch("m/blocks.0") as lease:
            self.assert_lease_holds(lease, self.block_names(0))

    def test_closed_session_refuses_calls(self):
        session = self.client.session()
        session.close()
        with self.assertRaises(tierd.TierdError) as caught:
            session.fetch("m/blocks.0")
        self.assertEqual(caught.exception.code, tierd.StatusCode.UNAVAILABLE)

    def test_a_durable_store_survives_a_killed_daemon_and_others_do_not(self):
        kept = torch.randn(3, 300, device=torch_device())
        with self.client.session() as session:
            session.store_async("acts/kept", {"kv": kept}, durable=True)
            session.store_async("acts/volatile", torch.ones(64, device=torch_device()))
            session.flush()
        self.assertEqual(self.client.stats().durable_objects, 1)
        self.client.close()
        self.daemon.kill()
        self.daemon = Daemon(self.directory)
        self.client = tierd.Client(self.daemon.socket, client_name=self.id())
        with self.client.session() as session:
            with session.fetch("acts/kept") as lease:
                self.assertEqual(list(lease.tensors), ["kv"])
                self.assertTrue(torch.equal(lease.tensors["kv"].cpu(), kept.cpu()))
            with self.assertRaises(tierd.TierdError) as caught:
                session.fetch("acts/volatile")
            self.assertEqual(caught.exception.code, tierd.StatusCode.NOT_FOUND)


class FetchManyTest(DaemonTestCase):
    """Session.fetch_many: a step's releases and fetches in one write, against a session quota of
    three leases."""

    daemon_flags = {"extra_flags": ("--session-max-leases=3",)}

    def setUp(self):
        super().setUp()
        self.tensors = model_tensors(seed=11)
        save_safetensors(self.tensors, os.path.join(self.model_dir("model"), "model.safetensors"))
        self.client.register_model("m", self.model_dir("model"))

    def assert_block(self, lease, block):
        self.assertEqual(lease.key, f"m/blocks.{block}")
        for name, fetched in lease.tensors.items():
            self.assertTrue(torch.equal(fetched.cpu(), self.tensors[name]), name)

    def test_each_step_releases_the_last_and_leases_its_keys_in_order(self):
        for session_socket in ("default", ""):
            client = tierd.Client(self.daemon.socket, session_socket=session_socket)
            with client.session() as session:
                held = []
                for step in range(4):
                    blocks = [(step * 3 + i) % BLOCKS for i in range(3)]
                    # At the quota: the releases must reach the daemon before the fetches.
                    held = session.fetch_many([f"m/blocks.{b}" for b in blocks], release=held)
                    self.assertEqual(len(held), 3)
                    for lease, block in zip(held, blocks):
                        self.assert_block(lease, block)
                self.wait_for_stats(lambda stats: stats.leases == 3, "the last step's leases held")
                session.release_many(held)
                self.assertTrue(all(lease.released for lease in held))
                self.wait_for_stats(lambda stats: stats.leases == 0, "every lease released")
            client.close()

    def test_a_failed_fetch_releases_the_others_and_names_its_key(self):
        with self.client.session() as session:
            with self.assertRaises(tierd.TierdError) as caught:
                session.fetch_many(["m/blocks.0", "m/no_such_block", "m/blocks.1"])
            self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertTrue(caught.exception.message.startswith("m/no_such_block: "),
                            caught.exception.message)
            self.wait_for_stats(lambda stats: stats.leases == 0, "the others released")
            with self.assertRaises(tierd.TierdError) as caught:
                session.fetch_many([f"m/blocks.{b}" for b in range(4)])
            self.assertEqual(caught.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.wait_for_stats(lambda stats: stats.leases == 0, "the others released")
            # The session goes on.
            for lease, block in zip(session.fetch_many(["m/blocks.4", "m/blocks.5"]), (4, 5)):
                self.assert_block(lease, block)
                lease.release()

    def test_another_sessions_leases_are_released_through_it(self):
        with self.client.session() as mine, self.client.session() as other:
            theirs = other.fetch_many(["m/blocks.0", "m/blocks.1"])
            self.wait_for_stats(lambda stats: stats.leases == 2, "the other session's leases")
            leases = mine.fetch_many(["m/blocks.2"], release=theirs)
            self.assertTrue(all(lease.released for lease in theirs))
            self.wait_for_stats(lambda stats: stats.leases == 1, "only this session's lease held")
            mine.release_many(leases)
            self.wait_for_stats(lambda stats: stats.leases == 0, "every lease released")

    def test_after_the_daemon_is_gone_fetch_many_is_unavailable(self):
        session = self.client.session()
        leases = session.fetch_many(["m/blocks.0"])
        self.daemon.kill()
        with self.assertRaises(tierd.TierdError) as caught:
            session.fetch_many(["m/blocks.1"], release=leases)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertTrue(all(lease.released for lease in leases))
        session.close()
        self.daemon = Daemon(self.directory)  # for tearDown's stop


class ClientGroupTest(DaemonTestCase):
    """A client group (tierd --client-groups) through the Python client."""

    # The test's own group: the one group an unprivileged process can give its files.
    daemon_flags = {"extra_flags": (
        f"--client-groups=tenant:{grp.getgrgid(os.getgid()).gr_name}:4MiB",)}

    def test_a_groups_stored_objects_are_its_own(self):
        x = torch.randn(5, 7, device=torch_device())
        with tierd.Client(self.daemon.socket, client_group="tenant") as tenant:
            with tenant.session() as session:
                self.assertEqual(session.transport, "socket")
                session.store_async("acts/t", x)
                session.flush()
                with session.fetch("acts/t") as lease:
                    self.assertTrue(torch.equal(lease.tensor.cpu(), x.cpu()))
        with self.client.session() as session:
            with self.assertRaises(tierd.TierdError) as caught:
                session.fetch("acts/t")
            self.assertEqual(caught.exception.code, tierd.StatusCode.NOT_FOUND)
        stats = self.client.stats()
        self.assertEqual([group.name for group in stats.client_groups], ["default", "tenant"])
        self.assertEqual(stats.client_groups[1].gpu.budget_bytes, 4 << 20)

    def test_a_group_the_daemon_lacks_gets_no_session(self):
        with tierd.Client(self.daemon.socket, client_group="absent") as absent:
            with self.assertRaises(tierd.TierdError) as caught:
                absent.session()
            self.assertEqual(caught.exception.code, tierd.StatusCode.UNAVAILABLE)
            self.assertIn("client group absent", caught.exception.message)


class WaitUntilReadyTest(unittest.TestCase):
    """wait_until_ready() returns once the daemon serves, not once its socket accepts: a daemon
    listens (health NOT_SERVING, calls answered UNAVAILABLE "tierd is starting") while it pins the
    first GiB of its host cache and allocates its staging pool."""

    def setUp(self):
        self.directory = tempfile.mkdtemp(prefix="tierd-python-test.")

    def tearDown(self):
        shutil.rmtree(self.directory, ignore_errors=True)

    def test_a_model_registers_right_after_wait_until_ready(self):
        model = os.path.join(self.directory, "model")
        os.makedirs(model)
        save_safetensors(model_tensors(seed=3), os.path.join(model, "model.safetensors"))
        # 1 GiB of host cache (pinned before serving on CUDA) and of staging pool (shared memory
        # the kernel zeroes on the host backend): the daemon takes a while between listening and
        # serving.
        daemon = Daemon(self.directory, gpu_pool="1GiB", gpu_slab="256MiB", host_cache="1GiB",
                        wait=False)
        try:
            deadline = time.monotonic() + TIMEOUT
            while not os.path.exists(daemon.socket):
                self.assertIsNone(daemon.process.poll(), daemon.log())
                self.assertLess(time.monotonic(), deadline, "the socket never appeared")
                time.sleep(0.001)
            with tierd.Client(daemon.socket) as client:
                client.wait_until_ready(timeout=TIMEOUT)
                summary = client.register_model("m", model)
                self.assertEqual(summary.objects, BLOCKS + 1)
        finally:
            daemon.stop()

    def test_without_a_daemon_it_raises_unavailable_naming_the_socket(self):
        socket = os.path.join(self.directory, "absent.sock")
        with tierd.Client(socket) as client:
            started = time.monotonic()
            with self.assertRaises(tierd.TierdError) as caught:
                client.wait_until_ready(timeout=0.5)
            self.assertLess(time.monotonic() - started, 5)
        self.assertEqual(caught.exception.code, tierd.StatusCode.UNAVAILABLE)
        self.assertIn(socket, caught.exception.message)
