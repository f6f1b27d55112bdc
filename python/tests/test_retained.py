"""Retained sets and mapped weights (Session.retain, tierd.torch.map_weights) and processed weights
(tierd.processed): a model mapped in another process after other models went through the pool,
without a copy; sets stored under an identity, byte-exact, and every kind of miss."""

import json
import os

import torch

import tierd
import tierd.processed
import tierd.torch
from dit_model import DiT, save_safetensors
from tierd_testing import Daemon, DaemonTestCase, TIMEOUT, run_python, synchronize, torch_device

CONFIG = dict(blocks=4, dim=64, ffn_dim=256, heads=4, in_dim=16, context_dim=32)

# Maps model "dit" in a process of its own, runs it on the inputs saved at argv[2] and saves the
# outputs to argv[3], with the daemon's GPU misses before and after.
_MAP_IN_ANOTHER_PROCESS = """
import sys, torch, tierd, tierd.torch
from dit_model import DiT
socket, inputs_path, outputs_path, device = sys.argv[1:5]
inputs = torch.load(inputs_path)
with tierd.Client(socket) as client:
    misses = client.stats().gpu.misses
    torch.manual_seed(99)
    module = DiT(**%r).to(device).eval()
    with tierd.torch.map_weights(module, client, "dit") as mapped, torch.no_grad():
        outputs = [module(*[t.to(device) for t in args]).cpu() for args in inputs]
    torch.save({"outputs": outputs, "misses": client.stats().gpu.misses - misses}, outputs_path)
""" % (CONFIG,)


class RetainedWeightsTest(DaemonTestCase):
    # 4 MiB of staging; retained sets may take half of it, which the model (1.2 MiB) fits.
    daemon_flags = dict(gpu_pool="4MiB", gpu_slab="4MiB")

    def setUp(self):
        super().setUp()
        torch.manual_seed(3)
        self.device = torch_device()
        self.reference = DiT(**CONFIG).to(self.device).eval()
        self.register_module("dit", self.reference)
        generator = torch.Generator().manual_seed(11)
        self.inputs = [(torch.randn(2, 24, 16, generator=generator),
                        torch.randn(2, 8, 32, generator=generator),
                        torch.rand(2, generator=generator)) for _ in range(2)]
        with torch.no_grad():
            self.expected = [self.reference(*[t.to(self.device) for t in args]).cpu()
                             for args in self.inputs]

    def fresh_module(self):
        torch.manual_seed(99)
        return DiT(**CONFIG).to(self.device).eval()

    def run_module(self, module):
        with torch.no_grad():
            outputs = [module(*[t.to(self.device) for t in args]).cpu() for args in self.inputs]
        synchronize()
        return outputs

    def stream_another_model_through(self, copies):
        """Registers `copies` other models of the same size and fetches all their objects: more
        than the pool holds."""
        for copy in range(copies):
            name = f"other{copy}"
            torch.manual_seed(100 + copy)
            self.register_module(name, DiT(**CONFIG))
            with self.client.session() as session:
                for info in self.client.list_objects(name):
                    session.fetch(info.key).release()

    def test_a_retained_model_is_mapped_by_a_later_process_without_a_copy(self):
        with self.client.session() as session:
            retained = session.retain("dit")
            self.assertEqual(retained.target, "dit")
            self.assertFalse(retained.asleep)
            self.assertEqual(retained.objects, len(self.client.list_objects("dit")))
        # Twice the pool goes through it after the session that retained the model ended.
        self.stream_another_model_through(copies=4)
        self.assertTrue(all(info.on_gpu for info in self.client.list_objects("dit")))
        inputs_path = os.path.join(self.directory, "inputs.pt")
        outputs_path = os.path.join(self.directory, "outputs.pt")
        torch.save(self.inputs, inputs_path)
        child = run_python(_MAP_IN_ANOTHER_PROCESS, self.daemon.socket, inputs_path, outputs_path,
                           str(self.device))
        _, errors = child.communicate(timeout=TIMEOUT)
        self.assertEqual(child.returncode, 0, errors)
        result = torch.load(outputs_path)
        self.assertEqual(result["misses"], 0, "every object was on the GPU: nothing copied")
        for got, want in zip(result["outputs"], self.expected):
            self.assertTrue(torch.equal(got, want))
        self.wait_for_stats(lambda stats: stats.leases == 0, "the child's leases released")

    def test_mapped_weights_are_views_and_copied_weights_hold_no_lease(self):
        module = self.fresh_module()
        with tierd.torch.map_weights(module, self.client, "dit") as mapped:
            self.assertEqual(mapped.streamed_units, [])
            self.assertGreater(self.client.stats().leases, 0)
            for got, want in zip(self.run_module(module), self.expected):
                self.assertTrue(torch.equal(got, want))
        module = self.fresh_module()
        with tierd.torch.map_weights(module, self.client, "dit", copy=True):
            self.wait_for_stats(lambda stats: stats.leases == 0, "the copies' leases released")
            for got, want in zip(self.run_module(module), self.expected):
                self.assertTrue(torch.equal(got, want))

    def test_retained_sets_report_sleep_and_wake(self):
        with self.client.session() as session:
            session.retain("dit", ttl=3600)
            sets, on_gpu, budget = session.retained()
            self.assertEqual([s.target for s in sets], ["dit"])
            self.assertEqual(sets[0].ttl, 3600)
            self.assertEqual(budget, 2 << 20)
            self.assertEqual(on_gpu, sets[0].bytes)
            slept = session.sleep("dit")
            self.assertTrue(slept.asleep)
            self.assertFalse(any(info.on_gpu for info in self.client.list_objects("dit")))
            self.assertEqual(self.client.stats().retained_bytes, 0)
            woken = session.wake("dit")
            self.assertFalse(woken.asleep)
            self.assertEqual(woken.moved, 0)
            with self.assertRaises(ValueError):
                session.retain("dit/blocks.0", ttl=-1)
            session.unretain("dit")
            self.assertEqual(session.retained()[0], [])


def quantize(state_dict):
    """The test's recipe: each 2-D weight as int8 with a per-row scale, the rest as it is."""
    processed = {}
    for name, tensor in state_dict.items():
        if tensor.dim() == 2 and name.endswith("weight"):
            scale = tensor.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127
            processed[name + ".int8"] = torch.round(tensor / scale).to(torch.int8)
            processed[name + ".scale"] = scale.to(torch.float16)
        else:
            processed[name] = tensor.clone()
    return processed


class ProcessedWeightsTest(DaemonTestCase):
    daemon_flags = dict(gpu_pool="8MiB", gpu_slab="4MiB")

    def setUp(self):
        super().setUp()
        torch.manual_seed(5)
        self.checkpoint = self.model_dir("checkpoint")
        self.weights = DiT(**CONFIG).state_dict()
        save_safetensors(self.weights, os.path.join(self.checkpoint, "model.safetensors"))
        self.identity = tierd.processed.identity(self.checkpoint, recipe="int8 rows v1")
        self.processed = quantize(self.weights)

    def assert_loads_exactly(self, client, identity, expected, **options):
        weights = tierd.processed.load(client, identity, **options)
        self.assertIsNotNone(weights)
        with weights:
            self.assertEqual(sorted(weights.tensors), sorted(expected))
            for name, tensor in expected.items():
                self.assertTrue(torch.equal(weights.tensors[name].cpu(), tensor), name)

    def test_a_saved_set_loads_byte_exact_and_other_identities_miss(self):
        self.assertIsNone(tierd.processed.load(self.client, self.identity))
        tierd.processed.save(self.client, self.identity, self.processed)
        self.assert_loads_exactly(self.client, self.identity, self.processed)
        for other in (tierd.processed.identity(self.checkpoint, recipe="int8 rows v2"),
                      tierd.processed.identity(self.checkpoint, recipe="int8 rows v1", rank=1)):
            self.assertIsNone(tierd.processed.load(self.client, other))
        # A file of the checkpoint changes: another identity, a miss.
        os.utime(os.path.join(self.checkpoint, "model.safetensors"), ns=(1, 1))
        self.assertIsNone(tierd.processed.load(
            self.client, tierd.processed.identity(self.checkpoint, recipe="int8 rows v1")))
        self.wait_for_stats(lambda stats: stats.leases == 0, "every lease released")

    def test_a_set_stored_under_another_identity_is_never_served(self):
        tierd.processed.save(self.client, self.identity, self.processed)
        original = tierd.processed.namespace
        try:
            # Two identities whose keys collide: the manifest's own identity decides.
            tierd.processed.namespace = lambda _identity: original(self.identity)
            self.assertIsNone(tierd.processed.load(self.client, self.identity + " but another"))
        finally:
            tierd.processed.namespace = original

    def test_a_set_missing_an_object_is_a_miss_never_a_partial_model(self):
        tierd.processed.OBJECT_BYTES, saved = 64 << 10, tierd.processed.OBJECT_BYTES
        try:
            tierd.processed.save(self.client, self.identity, self.processed)
        finally:
            tierd.processed.OBJECT_BYTES = saved
        prefix = tierd.processed.namespace(self.identity)
        with self.client.session() as session:
            with session.fetch(f"{prefix}/manifest") as lease:
                manifest = json.loads(lease.tensors["manifest"].cpu().numpy().tobytes())
            self.assertGreater(len(manifest["objects"]), 2)
            session.evict(manifest["objects"][1], tier="all")
        self.assertIsNone(tierd.processed.load(self.client, self.identity))

    def test_saving_again_replaces_the_set_and_deletes_the_old_objects(self):
        tierd.processed.save(self.client, self.identity, self.processed, retain=True)
        prefix = tierd.processed.namespace(self.identity)
        with self.client.session() as session:
            with session.fetch(f"{prefix}/manifest") as lease:
                old = json.loads(lease.tensors["manifest"].cpu().numpy().tobytes())
        changed = {name: tensor + 1 if tensor.is_floating_point() else tensor
                   for name, tensor in self.processed.items()}
        tierd.processed.save(self.client, self.identity, changed)
        self.assert_loads_exactly(self.client, self.identity, changed)
        with self.client.session() as session:
            for key in old["objects"]:
                with self.assertRaises(tierd.TierdError) as gone:
                    session.fetch(key)
                self.assertEqual(gone.exception.code, tierd.StatusCode.NOT_FOUND)
            # Still retained, now over the new objects.
            sets, _, _ = session.retained()
            self.assertEqual([s.target for s in sets], [prefix + "/"])
            self.assertEqual(sets[0].objects, len(old["objects"]) + 1)

    def test_a_durable_set_survives_a_daemon_restart(self):
        tierd.processed.save(self.client, self.identity, self.processed, durable=True,
                             retain=True)
        self.client.close()
        self.daemon.stop()
        self.daemon = Daemon(self.directory, **self.daemon_flags)
        self.client = tierd.Client(self.daemon.socket, client_name=self.id())
        self.assert_loads_exactly(self.client, self.identity, self.processed, retain=True)
        with self.client.session() as session:
            sets, _, _ = session.retained()
            self.assertEqual([s.target for s in sets],
                             [tierd.processed.namespace(self.identity) + "/"])

    def test_bad_input_is_refused_before_anything_is_stored(self):
        with self.assertRaises(ValueError):
            tierd.processed.save(self.client, "", self.processed)
        with self.assertRaises(ValueError):
            tierd.processed.save(self.client, self.identity, {})
        with self.assertRaises(ValueError):
            tierd.processed.save(self.client, self.identity, {"x": [1, 2]})
        self.assertIsNone(tierd.processed.load(self.client, self.identity))

