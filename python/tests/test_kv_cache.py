"""tierd.kv_cache.LayeredKVStore against a real daemon: each layer gets back all of its tokens,
full chunks are stored, and a saved store continues in another process and after the daemon's
restart (durable). Attention is played by hand: new keys and values each step, compared with the
plain concatenation a resident cache would return."""

import os
import unittest

import torch

import tierd
from tierd.kv_cache import LayeredKVStore
from tierd_testing import Daemon, DaemonTestCase, run_python, torch_device

LAYERS = 3
HEADS = 2
HEAD_DIM = 8
CHUNK = 4


def new_tokens(layer, step, count):
    """The keys and values layer `layer` appends at `step`: the same in every process."""
    generator = torch.Generator().manual_seed(1000 * step + layer)
    k = torch.randn(2, HEADS, count, HEAD_DIM, generator=generator)
    v = torch.randn(2, HEADS, count, HEAD_DIM, generator=generator)
    return k.to(torch_device()), v.to(torch_device())


def reference(steps):
    """What each layer holds after `steps` = [(step, count), ...]: the plain concatenation."""
    layers = []
    for layer in range(LAYERS):
        parts = [new_tokens(layer, step, count) for step, count in steps]
        layers.append((torch.cat([k for k, _ in parts], dim=-2),
                       torch.cat([v for _, v in parts], dim=-2)))
    return layers


def run(store, steps):
    """Runs `steps` through `store` as a model's forwards would (each layer prefetching the next);
    returns what each layer got back at the last step."""
    got = []
    for step, count in steps:
        got = []
        for layer in range(LAYERS):
            store.prefetch(layer + 1)
            got.append(store.update(layer, *new_tokens(layer, step, count)))
    return got


# A prefill of 10 tokens, then 7 decode steps of one.
FIRST = [(0, 10)] + [(step, 1) for step in range(1, 8)]
# What a later process appends.
LATER = [(step, 1) for step in range(8, 12)] + [(12, 6)]


class LayeredKVStoreTest(DaemonTestCase):
    def assert_layers_equal(self, got, expected):
        self.assertEqual(len(got), len(expected))
        for layer, ((k, v), (want_k, want_v)) in enumerate(zip(got, expected)):
            self.assertTrue(torch.equal(k.cpu(), want_k.cpu()), f"layer {layer} keys")
            self.assertTrue(torch.equal(v.cpu(), want_v.cpu()), f"layer {layer} values")

    def test_each_layer_gets_all_its_tokens_and_full_chunks_are_stored(self):
        with self.client.session() as session:
            store = LayeredKVStore(session, "doc", LAYERS, chunk_tokens=CHUNK)
            for count in range(1, len(FIRST) + 1):
                got = run(store, FIRST[count - 1:count])
                self.assert_layers_equal(got, reference(FIRST[:count]))
            self.assertEqual([store.tokens(layer) for layer in range(LAYERS)], [17] * LAYERS)
            self.assertEqual(store.tokens(LAYERS), 0)
            store.close()
            session.flush()
            # 17 tokens: four chunks of four per layer are stored, one token stays a tail.
            self.assertEqual(self.client.stats().stored_objects, 4 * LAYERS)
            with session.fetch("kv/doc.l1.c3") as lease:
                want_k, want_v = reference(FIRST)[1]
                self.assertTrue(torch.equal(lease.tensors["k"].cpu(), want_k[:, :, 12:16].cpu()))
                self.assertTrue(torch.equal(lease.tensors["v"].cpu(), want_v[:, :, 12:16].cpu()))
        self.wait_for_stats(lambda stats: stats.leases == 0, "every chunk's lease released")

    def test_a_saved_store_continues_in_another_process(self):
        writer = run_python(
            "import sys, tierd, test_kv_cache as t\n"
            "from tierd.kv_cache import LayeredKVStore\n"
            "session = tierd.Client(sys.argv[1]).session()\n"
            "store = LayeredKVStore(session, 'doc', t.LAYERS, chunk_tokens=t.CHUNK)\n"
            "t.run(store, t.FIRST)\n"
            "store.save()\n"
            "session.close()\n", self.daemon.socket)
        _, errors = writer.communicate(timeout=60)
        self.assertEqual(writer.returncode, 0, errors)
        with self.client.session() as session:
            store = LayeredKVStore.open(session, "doc")
            self.assertEqual((store.layers, store.chunk_tokens, store.tokens()), (LAYERS, CHUNK, 17))
            got = run(store, LATER)
            self.assert_layers_equal(got, reference(FIRST + LATER))
            store.close()
        self.wait_for_stats(lambda stats: stats.leases == 0, "every chunk's lease released")

    def test_a_durable_store_survives_the_daemons_restart(self):
        with self.client.session() as session:
            store = LayeredKVStore(session, "doc", LAYERS, chunk_tokens=CHUNK, durable=True)
            run(store, FIRST)
            store.save()
            store.close()
        self.client.close()
        self.daemon.kill()
        self.daemon = Daemon(self.directory)
        self.client = tierd.Client(self.daemon.socket, client_name=self.id())
        with self.client.session() as session:
            store = LayeredKVStore.open(session, "doc", durable=True)
            self.assert_layers_equal(run(store, LATER), reference(FIRST + LATER))
            store.close()

    def test_saves_at_a_chunk_boundary_and_again_later_continue_where_they_stopped(self):
        # 16 tokens: four chunks, no tail; then 17 and a tail; then a save right after open.
        at_boundary = [(0, 10)] + [(step, 1) for step in range(1, 7)]
        with self.client.session() as session:
            with LayeredKVStore(session, "doc", LAYERS, chunk_tokens=CHUNK) as store:
                run(store, at_boundary)
                store.save()
                self.assertEqual(LayeredKVStore.open(session, "doc").tokens(), 16)
                run(store, [(7, 1)])
                store.save()
            with LayeredKVStore.open(session, "doc") as store:
                self.assertEqual(store.tokens(), 17)
                store.save()  # nothing new: the same manifest
            with LayeredKVStore.open(session, "doc") as store:
                self.assert_layers_equal(run(store, LATER), reference(at_boundary + [(7, 1)] + LATER))
        self.wait_for_stats(lambda stats: stats.leases == 0, "every chunk's lease released")

    def test_what_cannot_be_done_says_why(self):
        with self.client.session() as session:
            with self.assertRaises(tierd.TierdError) as caught:
                LayeredKVStore.open(session, "never-saved")
            self.assertEqual(caught.exception.code, tierd.StatusCode.NOT_FOUND)
            store = LayeredKVStore(session, "half", LAYERS, chunk_tokens=CHUNK)
            store.update(0, *new_tokens(0, 0, 3))
            with self.assertRaises(ValueError) as caught:
                store.save()  # layer 0 holds 3 tokens, the others none
            self.assertIn("whole forward", str(caught.exception))
            for bad in (dict(name="a/b"), dict(namespace=""), dict(layers=0)):
                arguments = dict(session=session, name="n", layers=LAYERS)
                arguments.update(bad)
                with self.assertRaises(ValueError):
                    LayeredKVStore(**arguments)


if __name__ == "__main__":
    unittest.main()
