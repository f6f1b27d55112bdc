"""Weights held compressed in a real daemon's host cache (docs/COMPRESSION.md): tensors fetched
after compression equal the file's; int8 weights stay raw; a model registered with keep_raw is
never compressed, and says so after a restart; --compress-weights=false compresses nothing."""

import os
import time
import unittest

import torch

from dit_model import save_safetensors
from tierd_testing import Daemon, DaemonTestCase

BLOCKS = 4


def model_tensors(seed):
    """Per block a bf16 weight N(0, 0.02²) of 256 KiB and an fp32 norm; one block of int8 weights
    (nothing to gain)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for block in range(BLOCKS):
        tensors[f"blocks.{block}.w"] = (torch.randn(256, 512, generator=generator) * 0.02).to(
            torch.bfloat16)
        tensors[f"blocks.{block}.norm"] = torch.randn(512, generator=generator)
    tensors[f"blocks.{BLOCKS}.w"] = torch.randint(-128, 128, (512, 512), generator=generator,
                                                   dtype=torch.int8)
    return tensors


class CompressionTest(DaemonTestCase):
    def setUp(self):
        super().setUp()
        self.tensors = model_tensors(seed=3)
        save_safetensors(self.tensors, os.path.join(self.model_dir("model"), "model.safetensors"))

    def fetch_all(self, model):
        """Fetches every block and checks its tensors against the file's."""
        with self.client.session() as session:
            for block in range(BLOCKS + 1):
                with session.fetch(f"{model}/blocks.{block}") as lease:
                    for name, tensor in lease.tensors.items():
                        self.assertTrue(torch.equal(tensor.cpu(), self.tensors[name]), name)

    def test_weights_are_held_compressed_and_fetched_exactly(self):
        self.client.register_model("m", self.model_dir("model"))
        self.fetch_all("m")
        stats = self.wait_for_stats(
            lambda s: s.objects_encoded + s.objects_kept_raw == BLOCKS + 1, "the compressor")
        self.assertEqual(stats.objects_encoded, BLOCKS)
        self.assertEqual(stats.objects_kept_raw, 1)  # the int8 block
        self.assertLess(stats.host_compressed_bytes, 0.75 * stats.host_compressed_raw_bytes)
        # Each object says what it takes in host memory: the compressed form's bytes, or its size.
        held = {info.key: info for info in self.client.list_objects("m")}
        self.assertEqual(sum(held[f"m/blocks.{b}"].host_bytes for b in range(BLOCKS)),
                         stats.host_compressed_bytes)
        self.assertEqual(held[f"m/blocks.{BLOCKS}"].host_bytes, held[f"m/blocks.{BLOCKS}"].size)
        self.client.evict("m/", tier="gpu")
        self.fetch_all("m")
        stats = self.client.stats()
        self.assertEqual(stats.objects_decoded, BLOCKS)
        self.assertGreater(stats.decode_micros, 0)
        self.assertEqual(stats.bytes_host_to_gpu_compressed, stats.host_compressed_bytes)
        self.assertEqual(stats.decode_failures, 0)

    def test_a_model_registered_keep_raw_is_never_compressed(self):
        summary = self.client.register_model("raw", self.model_dir("model"), keep_raw=True)
        self.assertTrue(summary.keep_raw)
        self.fetch_all("raw")
        time.sleep(0.3)
        stats = self.client.stats()
        self.assertEqual(stats.objects_encoded + stats.objects_kept_raw, 0)
        self.assertEqual(stats.host_compressed_objects, 0)
        # The choice is the registration's: it outlives a restart.
        self.client.close()
        self.daemon.stop()
        self.daemon = Daemon(self.directory)
        self.client = type(self.client)(self.daemon.socket)
        self.assertTrue([m for m in self.client.list_models() if m.name == "raw"][0].keep_raw)


class CompressionOffTest(DaemonTestCase):
    daemon_flags = {"extra_flags": ("--compress-weights=false",)}

    def test_nothing_is_compressed(self):
        tensors = model_tensors(seed=4)
        save_safetensors(tensors, os.path.join(self.model_dir("model"), "model.safetensors"))
        self.client.register_model("m", self.model_dir("model"))
        with self.client.session() as session:
            for block in range(BLOCKS + 1):
                with session.fetch(f"m/blocks.{block}"):
                    pass
        time.sleep(0.3)
        stats = self.client.stats()
        self.assertEqual(stats.objects_encoded + stats.objects_kept_raw, 0)


if __name__ == "__main__":
    unittest.main()
