"""The two-stage pipeline example (python/examples/two_stage_pipeline.py) against two real daemons
that are each other's peers: window t's activations are stored through the first daemon and
fetched through the second, and the outputs equal a one-GPU run's, with and without overlap. On
the CUDA build both daemons share one GPU, which runs the same protocol as two GPUs."""

import copy
import os
import shutil
import tempfile
import time
import unittest

import torch

import tierd
from tierd_testing import TIMEOUT, Daemon
from dit_model import DiT
from two_stage_pipeline import TwoStagePipeline, compare, reference_outputs, windows

WINDOWS = 5


class TwoStagePipelineTest(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.mkdtemp(prefix="tierd-pipeline-test-")
        self.dirs = [os.path.join(self.directory, f"gpu{i}") for i in range(2)]
        for d in self.dirs:
            os.mkdir(d)
        sockets = [os.path.join(d, "gpu0.sock") for d in self.dirs]
        peers = f"--peers={sockets[0]},{sockets[1]}"
        self.daemons = []
        self.addCleanup(shutil.rmtree, self.directory, ignore_errors=True)
        for d in self.dirs:
            daemon = Daemon(d, extra_flags=(peers,))
            self.addCleanup(daemon.stop)
            self.daemons.append(daemon)
        self.clients = [tierd.Client(daemon.socket) for daemon in self.daemons]
        for client in self.clients:
            self.addCleanup(client.close)
        self.sessions = [client.session() for client in self.clients]
        for session in self.sessions:
            self.addCleanup(session.close)

    def wait_until_no_leases(self, client):
        deadline = time.monotonic() + TIMEOUT
        while client.stats().leases != 0:
            self.assertLess(time.monotonic(), deadline, "leases still held")
            time.sleep(0.01)

    def test_outputs_equal_a_one_gpu_run_with_and_without_overlap(self):
        torch.manual_seed(0)
        model = DiT(blocks=4, dim=64, ffn_dim=128, heads=4).eval()
        patches, context, timestep = windows(WINDOWS, 32, 16, 8, 32, torch.device("cpu"))
        expected = reference_outputs(copy.deepcopy(model), patches, context, timestep,
                                     self.sessions[0].device)
        pipeline = TwoStagePipeline(model, 2, self.sessions[0], self.sessions[1])
        for overlap in (True, False):
            with self.subTest(overlap=overlap):
                outputs = pipeline.run(patches, context, timestep, overlap=overlap)
                self.assertEqual(len(outputs), WINDOWS)
                equal, worst = compare(expected, outputs)
                self.assertTrue(equal, f"largest difference {worst}")
        # Every window went from the first daemon to the second, and nothing is left lent.
        self.assertEqual(self.clients[1].stats().peer_fetches, 2 * WINDOWS)
        self.assertEqual(self.clients[0].stats().peer_fetches, 0)
        self.wait_until_no_leases(self.clients[0])

    def test_a_window_never_stored_is_not_found_through_either_daemon(self):
        for session in self.sessions:
            with self.assertRaises(tierd.TierdError) as raised:
                session.fetch("pipeline/activations/never")
            self.assertEqual(raised.exception.code, tierd.StatusCode.NOT_FOUND)


if __name__ == "__main__":
    unittest.main()
