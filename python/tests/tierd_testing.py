"""What the Python tests share: a real tierd daemon in a temporary directory, on the device the
run asked for (TIERD_TEST_DEVICE: "host" or "cuda:N"), and helpers to wait on its stats."""

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import torch

import tierd

TEST_DEVICE = os.environ.get("TIERD_TEST_DEVICE", "host")
TIMEOUT = 60.0
# How long one test may run before it counts as hung.
HANG_SECONDS = 240


def torch_device():
    """Where tensors the tests fetch live: the daemon's GPU, or the CPU on the host backend."""
    return torch.device(TEST_DEVICE) if TEST_DEVICE.startswith("cuda") else torch.device("cpu")


def synchronize():
    if torch_device().type == "cuda":
        torch.cuda.synchronize()


class Daemon:
    """tierd started on a socket in `directory`; stop() sends SIGTERM and checks it exits 0. Unless
    `wait` is false, returns once the daemon answers."""

    def __init__(self, directory, gpu_pool="8MiB", gpu_slab="4MiB", host_cache="64MiB",
                 extra_flags=(), wait=True):
        self.directory = directory
        self.socket = os.path.join(directory, "gpu0.sock")
        self.log_path = os.path.join(directory, "tierd.log")
        argv = [os.environ["TIERD_BIN"], f"--device={TEST_DEVICE}", f"--socket={self.socket}",
                f"--state-dir={directory}/state", f"--host-cache-bytes={host_cache}",
                f"--gpu-pool-bytes={gpu_pool}", f"--gpu-slab-bytes={gpu_slab}",
                "--shutdown-grace-ms=2000", *extra_flags]
        if not any(flag.startswith("--compress-weights") for flag in extra_flags):
            # Off by default in the daemon; the tests serve weights through it, decoding objects
            # of more than 20 MiB in pieces.
            argv += ["--compress-weights=true", "--decode-scratch-mib=64"]
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + TIMEOUT
        while wait:
            if self.process.poll() is not None:
                raise RuntimeError(f"tierd exited with {self.process.returncode}:\n{self.log()}")
            # A fresh channel per try: a failed one backs off for seconds before trying again.
            with tierd.Client(self.socket, timeout=1.0) as client:
                try:
                    client.stats()
                    break
                except tierd.TierdError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"tierd did not answer:\n{self.log()}") from None
            time.sleep(0.05)

    def log(self):
        with open(self.log_path, "rb") as log:
            return log.read().decode(errors="replace")

    def kill(self):
        """SIGKILL: the daemon gets no chance to clean up or flush anything."""
        self.process.kill()
        self.process.wait(TIMEOUT)
        self._log.close()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise RuntimeError(f"tierd did not exit after SIGTERM:\n{self.log()}") from None
        finally:
            self._log.close()
        if code != 0:
            raise RuntimeError(f"tierd exited with {code}:\n{self.log()}")


class DaemonTestCase(unittest.TestCase):
    """A test with a fresh daemon and a client connected to it."""

    daemon_flags = {}

    def setUp(self):
        # A test that hangs (a wait with no deadline: a device event, a stream) ends the run with
        # every thread's stack rather than running into the suite's timeout silently.
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
        self.directory = tempfile.mkdtemp(prefix="tierd-python-test.")
        self.daemon = Daemon(self.directory, **self.daemon_flags)
        self.client = tierd.Client(self.daemon.socket, client_name=self.id())

    def tearDown(self):
        self.client.close()
        self.daemon.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
        faulthandler.cancel_dump_traceback_later()

    def model_dir(self, name):
        path = os.path.join(self.directory, name)
        os.makedirs(path, exist_ok=True)
        return path

    def register_module(self, name, module, grouping="block"):
        """Saves `module`'s state dict as model `name`'s one safetensors file (in model_dir(name))
        and registers it."""
        from dit_model import save_safetensors  # the examples' writer
        save_safetensors(module.state_dict(),
                         os.path.join(self.model_dir(name), "model.safetensors"))
        self.client.register_model(name, self.model_dir(name), grouping=grouping)

    def evict_once_copied(self, session, key):
        """Evicts `key` from the GPU. Its lease released, its copy may still be in flight (the
        daemon has not seen it complete yet): that is waited for."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                return session.evict(key)
            except tierd.TierdError as error:
                if "being copied" not in error.message or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def wait_for_stats(self, condition, what):
        """Polls GetStats until `condition(stats)` holds; fails the test naming `what` if it does
        not within the timeout."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            stats = self.client.stats()
            if condition(stats):
                return stats
            if time.monotonic() > deadline:
                self.fail(f"{what} never happened; last stats:\n{stats}")
            time.sleep(0.02)


def run_python(source, *args):
    """Starts `source` in a separate Python process with the tests' environment."""
    return subprocess.Popen([sys.executable, "-c", source, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
