"""What tierd's Python benchmarks share, so that none imports another: a daemon launcher (Daemon),
progress lines (log), timing on the GPU (timed, pinned_copy_rate), the flags every benchmark takes
(add_common_arguments), the header of a results file and its writing (results_header,
write_results), and two steps several benchmarks take (wait_for_compression, generate).

Torch is imported only by what needs it: the launcher and the results also serve benchmarks that
run without a GPU (remote_load_bench.py).
"""

import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The examples' models (dit_model, tp_layers, ...): python/examples in a source tree, examples/
# beside bench/ in a bundle. The client package itself comes from the environment.
for _candidate in (os.path.join(HERE, "..", "python", "examples"), os.path.join(HERE, "examples")):
    if os.path.isdir(_candidate) and _candidate not in sys.path:
        sys.path.insert(0, _candidate)


def log(message):
    """One progress line, with the time of day, flushed at once (benchmarks run for minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def timed(function):
    """Runs function() between two CUDA synchronisations; returns (its result, seconds)."""
    import torch
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = function()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def pinned_copy_rate(nbytes, repeat=10):
    """GB/s of torch's pinned host -> GPU copy of `nbytes` (cudaMemcpyAsync underneath), the best
    of `repeat`; the buffers are freed before it returns."""
    import torch
    source = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    target.copy_(source, non_blocking=True)
    best = min(timed(lambda: target.copy_(source, non_blocking=True))[1] for _ in range(repeat))
    del source, target
    torch.cuda.empty_cache()
    return nbytes / best / 1e9


class Daemon:
    """tierd on `device`, serving DIRECTORY/NAME.sock with its state in DIRECTORY/state-NAME and its
    log in DIRECTORY/tierd-NAME.log; the constructor returns once it answers, and exits the
    benchmark naming the log if it does not. Use it as a context manager, or call stop()."""

    def __init__(self, binary, directory, pool_bytes, slab_bytes, host_cache_bytes,
                 device="cuda:0", name="gpu0", extra_flags=(), ready_timeout=120):
        import tierd
        self.socket = os.path.join(directory, f"{name}.sock")
        self.log_path = os.path.join(directory, f"tierd-{name}.log")
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [binary, f"--device={device}", f"--socket={self.socket}",
             f"--state-dir={directory}/state-{name}", f"--host-cache-bytes={host_cache_bytes}",
             f"--gpu-pool-bytes={pool_bytes}", f"--gpu-slab-bytes={slab_bytes}", *extra_flags],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.process.poll() is not None:
                self._log.close()
                sys.exit(f"tierd exited with {self.process.returncode}; see {self.log_path}")
            with tierd.Client(self.socket, timeout=2.0) as client:
                try:
                    client.stats()
                    return
                except tierd.TierdError:
                    if time.monotonic() > deadline:
                        self.stop()
                        sys.exit(f"tierd did not answer in {ready_timeout} s; see {self.log_path}")
            time.sleep(0.1)

    def stop(self):
        """SIGTERM, and SIGKILL after 60 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.stop()


def add_common_arguments(parser, tierd_required=True, work_dir_required=False,
                         json_required=False):
    """--tierd (the daemon's binary), --work-dir (models, sockets, state and logs) and --json (the
    results file): what every benchmark that starts tierd takes."""
    parser.add_argument("--tierd", required=tierd_required, help="the tierd binary")
    parser.add_argument("--work-dir", required=work_dir_required,
                        help="where models, sockets, the daemons' state and logs go")
    parser.add_argument("--json", required=json_required, help="write the results here")


def results_header(benchmark):
    """What every results file starts with: the benchmark, the date, the machine, its GPUs and
    torch (when torch sees a GPU), and the command that ran it."""
    header = {"benchmark": benchmark, "date": datetime.date.today().isoformat(),
              "machine": platform.node(), "command": " ".join(sys.argv)}
    try:
        import torch
        if torch.cuda.is_available():
            header["gpu"] = torch.cuda.get_device_name()
            header["gpus"] = [torch.cuda.get_device_name(i)
                              for i in range(torch.cuda.device_count())]
        header["torch"] = torch.__version__
    except ImportError:
        pass
    return header


def write_results(results, path):
    """Writes `results` as indented JSON to `path` (when given) and says where."""
    if not path:
        return
    with open(path, "w") as out:
        json.dump(results, out, indent=2)
        out.write("\n")
    log(f"results written to {path}")


def wait_for_compression(client, objects):
    """Waits until the daemon's compressor has had `objects` objects; returns what it made."""
    started = time.monotonic()
    while True:
        stats = client.stats()
        if stats.objects_encoded + stats.objects_kept_raw >= objects:
            break
        if time.monotonic() - started > 600:
            sys.exit(f"the compressor had {stats.objects_encoded + stats.objects_kept_raw} of "
                     f"{objects} objects after 600 s")
        time.sleep(0.2)
    seconds = time.monotonic() - started
    ratio = stats.host_compressed_bytes / max(stats.host_compressed_raw_bytes, 1)
    log(f"compressed {stats.objects_encoded} objects ({stats.objects_kept_raw} kept raw) to "
        f"{ratio:.3f} of their size in {seconds:.1f} s")
    return {"objects_encoded": stats.objects_encoded, "objects_kept_raw": stats.objects_kept_raw,
            "compressed_bytes": stats.host_compressed_bytes,
            "raw_bytes": stats.host_compressed_raw_bytes, "ratio": ratio,
            "host_used_bytes": stats.host.used_bytes, "seconds_after_warm": seconds}


def generate(model, ids, tokens, runs=1, sampled=False):
    """`tokens` greedy tokens after `ids`, timed, the fastest of `runs` (after one untimed run
    when `runs` > 1); returns (tokens, seconds). `sampled`: sampled instead (temperature 1 from the
    whole vocabulary, the generator seeded alike each time: equal logits give equal tokens)."""
    import torch
    decoding = (dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sampled
                else dict(do_sample=False))

    def once():
        if sampled:
            torch.manual_seed(7)
        with torch.no_grad():
            out, seconds = timed(lambda: model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                min_new_tokens=tokens, **decoding))
        return out[:, ids.shape[1]:], seconds
    if runs > 1:
        once()
    return min((once() for _ in range(runs)), key=lambda run: run[1])
