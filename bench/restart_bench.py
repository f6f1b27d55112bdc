#!/usr/bin/env python3
"""Engine restart, weight phase: how long a new model-server process takes from its imports to a
Llama-architecture model on the GPU, its weights N(0, 0.02^2) in bf16 (40 layers of 5120, about
26 GB by default), each way measured in a process of its own, in the same run, on the same GPU:

  (a) transformers    AutoModelForCausalLM.from_pretrained(device_map="cuda") from the page cache
                      (the checkpoint on tmpfs, read once before)
  first load          tierd.transformers.from_pretrained(placement="mapped") of a newly registered
                      model: the daemon reads it from the files (its cold path) as it is mapped
  first load,         the same with placement="stream" (blocks streamed through the GPU pool, two
  streamed            ahead) under another name: timed to the logits of the first forward pass,
                      which is what brings every block to the GPU; without the host tier's
                      read-ahead (host_read_ahead=0), then with the default's 8 blocks
  (b) host tier       tierd.transformers.from_pretrained(placement="mapped") with the model in the
                      daemon's host memory only: every byte crosses the link
  (c) retained        the same, the model retained on the daemon's GPU (retain=True) by an earlier
                      process, after other models twice the GPU pool's size have been streamed
                      through the pool; and again after a restart of the daemon
  scale-out           a second process mapping the model while the first still holds it: its time,
                      the GPU memory it adds, and the host memory of the two engines and the
                      daemon's host tier (one copy of the model for the node)
  wake                the model put to sleep and woken, until its bytes are on the GPU: GB/s against
                      torch's pinned -> GPU copy of a 4 GiB buffer in the same process
                      (cudaMemcpyAsync underneath)
  processed weights   the layers' linear weights quantized to int8 rows: loading and processing
                      again, against mapping the set a first start saved (tierd.processed); the
                      bytes must be equal

Each process is timed from after its imports and its CUDA context (an engine creates both before
it loads weights) to the model ready on the GPU; its logits must equal (a)'s. The goal of (c) is
0.25 s (docs/BENCHMARKS.md).

    bench/restart_bench.py --tierd BUNDLE/bin/tierd --work-dir /dev/shm/rb --json out.json

--after-restart-only measures (a), the first loads (streamed; mapped and retained) and (c) after
the daemon's restart, and nothing between: the restart's figure alone, in a third of the time.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch

from bench_harness import (Daemon, add_common_arguments, log, pinned_copy_rate, results_header,
                           write_results)

MODEL = "llama"
STREAMED = "llama-streamed"  # the same checkpoint, registered again for the streamed first load
IDS = [list(range(1, 33))]

# The process each way is measured in: argv[1] is its settings as JSON; it prints one JSON line,
# and with "hold" keeps its model until its stdin closes.
CHILD = r"""
import cProfile, io, json, os, pstats, sys, time
def peak_rss():  # VmHWM: this process's own (getrusage's ru_maxrss survives exec)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
settings = json.loads(sys.argv[1])
import torch, transformers, tierd, tierd.processed, tierd.transformers
torch.zeros(1, device="cuda")  # the CUDA context, as an engine has before it loads weights
# transformers imports a model's modules (and generation's: torch._dynamo, sympy, ...) on first use:
# an engine has them imported before it loads weights, so a model of one layer is built first.
_config = transformers.AutoConfig.from_pretrained(settings["checkpoint"])
_tiny = _config.__class__(**dict(_config.to_dict(), num_hidden_layers=1, hidden_size=128,
                                  intermediate_size=256, num_attention_heads=1,
                                  num_key_value_heads=1, vocab_size=128))
with torch.device("meta"):
    transformers.AutoModelForCausalLM.from_config(_tiny)

def quantize(linears):  # the processing recipe: int8 rows with a float scale each
    out = {}
    for name, weight in linears.items():
        scale = weight.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127
        out[name + ".int8"] = torch.round(weight.float() / scale).to(torch.int8)
        out[name + ".scale"] = scale
    return out

def layer_linears(model):
    return {name: module.weight for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and ".layers." in name}
free_before, _ = torch.cuda.mem_get_info()
profile = cProfile.Profile() if settings.get("profile") else None
if profile is not None:
    profile.enable()
start = time.perf_counter()
processed = None
if settings["way"] == "transformers":
    model = transformers.AutoModelForCausalLM.from_pretrained(
        settings["checkpoint"], dtype=torch.bfloat16, device_map="cuda")
    client = None
elif settings["way"] == "processed":
    client = tierd.Client(settings["socket"])
    model = None
    processed = tierd.processed.load(client, settings["identity"], retain=True)
else:
    client = tierd.Client(settings["socket"])
    model = tierd.transformers.from_pretrained(
        settings["checkpoint"], client, name=settings["model"], placement=settings["placement"],
        retain=settings.get("retain"), host_read_ahead=settings.get("host_read_ahead", 8))
    if settings["way"] == "process":
        processed = quantize(layer_linears(model))
        if settings.get("save"):
            tierd.processed.save(client, settings["identity"], processed, retain=True)
logits = None
if settings.get("time_first_forward"):  # a streamed model's weights reach the GPU in its forward
    with torch.no_grad():
        logits = model(torch.tensor(settings["ids"], device="cuda")).logits.float().cpu()
torch.cuda.synchronize()
seconds = time.perf_counter() - start
if profile is not None:
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
    with open(settings["profile"], "w") as out:
        out.write(text.getvalue())
free_after, _ = torch.cuda.mem_get_info()
result = {"seconds": seconds, "gpu_bytes_added": free_before - free_after,
          "torch_allocated": torch.cuda.memory_allocated(),
          "peak_rss_bytes": peak_rss()}
if processed is not None:
    tensors = processed.tensors if hasattr(processed, "tensors") else processed
    result["processed_bytes"] = sum(t.numel() * t.element_size() for t in tensors.values())
    # A digest of every processed byte, for the parent to compare the ways.
    result["processed_digest"] = {
        name: int(t.contiguous().view(torch.uint8).to(torch.int64).sum()) for name, t in
        sorted(tensors.items())}
if model is None:
    print(json.dumps(result), flush=True)
    processed.close()
    client.close()
    sys.exit(0)
if logits is None:
    with torch.no_grad():
        logits = model(torch.tensor(settings["ids"], device="cuda")).logits.float().cpu()
if settings.get("save_logits"):
    torch.save(logits, settings["save_logits"])
if settings.get("reference"):
    result["logits_equal"] = bool(torch.equal(logits, torch.load(settings["reference"])))
print(json.dumps(result), flush=True)
if settings.get("hold"):
    sys.stdin.read()
if client is not None:
    model.tierd_weights.close()
    client.close()
"""


def run_child(settings, hold=False):
    """Runs one measured process; returns its result (and, with `hold`, the process, still
    holding its model)."""
    settings = dict(settings, ids=IDS, hold=hold)
    process = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(settings)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    line = process.stdout.readline()
    if not line:
        process.wait()
        sys.exit(f"the {settings['way']} process failed (exit {process.returncode})")
    result = json.loads(line)
    if hold:
        return result, process
    process.stdin.close()
    if process.wait() != 0:
        sys.exit(f"the {settings['way']} process exited with {process.returncode}")
    return result


def build_checkpoint(args, directory):
    import transformers
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
        num_key_value_heads=args.hidden // 128, max_position_embeddings=4096,
        initializer_range=0.02)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory, max_shard_size="5GB")
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return nbytes


def read_files_once(directory):
    """Reads the checkpoint's files, so that (a) reads them from the page cache."""
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as source:
            while source.read(64 << 20):
                pass


def stream_others(client, checkpoint, copies):
    """Registers the checkpoint `copies` more times under other names and fetches every object of
    each through the GPU pool; returns the bytes copied to the GPU meanwhile."""
    before = client.stats().bytes_host_to_gpu
    with client.session() as session:
        for copy in range(copies):
            name = f"other{copy}"
            client.register_model(name, checkpoint, grouping="block")
            keys = [info.key for info in client.list_objects(name)]
            for start in range(0, len(keys), 2):
                for lease in session.fetch_many(keys[start:start + 2]):
                    lease.release()
                torch.cuda.synchronize()
            client.evict(f"{name}/", tier="host")
            log(f"streamed {name} ({len(keys)} objects) through the pool")
    return client.stats().bytes_host_to_gpu - before


def wait_for_gpu_memory(nbytes, timeout=120):
    # What this process's allocator keeps (the copy measurement's buffers) is not the daemon's.
    gc.collect()
    torch.cuda.empty_cache()
    deadline = time.monotonic() + timeout
    while torch.cuda.mem_get_info()[0] < nbytes + (1 << 30):
        if time.monotonic() > deadline:
            sys.exit(f"the GPU did not have {nbytes >> 30} GiB free within {timeout} s "
                     f"({torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB free)")
        time.sleep(0.2)


def evict_from_gpu(client, model=MODEL):
    """Evicts the model from the GPU, waiting for the drains of the last process's releases."""
    deadline = time.monotonic() + 60
    while any(info.on_gpu for info in client.list_objects(model)):
        if time.monotonic() > deadline:
            sys.exit("the model stayed on the GPU for 60 s after its last process exited")
        client.evict(f"{model}/", tier="gpu")
        time.sleep(0.05)


class _SkipToRestart(Exception):
    """--after-restart-only: the measurements before the daemon's restart are skipped."""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, work_dir_required=True)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--intermediate", type=int, default=13824)
    parser.add_argument("--pool-gib", type=int, default=60)
    parser.add_argument("--retain-gib", type=int, default=44)
    parser.add_argument("--host-cache-gib", type=int, default=40)
    parser.add_argument("--slab-gib", type=int, default=8)
    parser.add_argument("--after-restart-only", action="store_true",
                        help="measure (a) and (c) after a daemon restart only: the model retained "
                             "by a first process, the daemon restarted, (c) mapped")
    args = parser.parse_args()
    import tierd
    os.makedirs(args.work_dir, exist_ok=True)
    checkpoint = os.path.join(args.work_dir, "checkpoint")
    results = results_header("restart")
    log("building the checkpoint")
    results["model_bytes"] = build_checkpoint(args, checkpoint)
    log(f"checkpoint: {results['model_bytes'] / 1e9:.1f} GB in {checkpoint}")
    read_files_once(checkpoint)
    reference = os.path.join(args.work_dir, "logits.pt")
    base = {"checkpoint": checkpoint, "model": MODEL}
    runs = {}
    runs["a_transformers"] = run_child(dict(base, way="transformers", save_logits=reference))
    log(f"(a) transformers: {runs['a_transformers']['seconds']:.2f} s")
    results["copy_gb_per_s"] = pinned_copy_rate(4 << 30, repeat=5)
    log(f"pinned -> GPU copy: {results['copy_gb_per_s']:.1f} GB/s")
    flags = [f"--retain-bytes={args.retain_gib}GiB", "--compress-weights=false"]
    daemon_settings = dict(binary=args.tierd, directory=args.work_dir,
                           pool_bytes=f"{args.pool_gib}GiB", slab_bytes=f"{args.slab_gib}GiB",
                           host_cache_bytes=f"{args.host_cache_gib}GiB", extra_flags=flags)
    tierd_way = dict(base, way="tierd", placement="mapped", reference=reference)
    # Where (c)'s profile goes: what its time is spent on.
    profile_path = os.path.join(args.work_dir, "retained-profile.txt")
    daemon = Daemon(**daemon_settings)
    try:
        tierd_way["socket"] = daemon.socket
        with tierd.Client(daemon.socket) as client:
            # The first load streamed, of the model registered under another name (its host copy
            # dropped after, so that the first load below is as cold).
            # Without the host tier's read-ahead first: the blocks asked two at a time.
            for run, read_ahead in (("first_load_streamed_no_read_ahead", 0),
                                    ("first_load_streamed", 8)):
                runs[run] = run_child(dict(tierd_way, model=STREAMED, placement="stream",
                                           time_first_forward=True, host_read_ahead=read_ahead))
                log(f"first load through tierd (cold), streamed, {read_ahead} blocks read ahead "
                    f"into the host tier, to the first logits: {runs[run]['seconds']:.2f} s")
                evict_from_gpu(client, STREAMED)
                client.evict(f"{STREAMED}/", tier="all")
            if args.after_restart_only:
                runs["first_load"] = run_child(dict(tierd_way, retain=True))
                log(f"first load through tierd (cold), retained: "
                    f"{runs['first_load']['seconds']:.2f} s")
                raise _SkipToRestart
            # (b): registered and read into the host tier by a first process, then off the GPU.
            # That first load (the daemon's cold path from the files, every block resident) is
            # recorded too: against (a), and against the cold path's rate.
            runs["first_load"] = run_child(tierd_way)
            log(f"first load through tierd (cold): {runs['first_load']['seconds']:.2f} s")
            evict_from_gpu(client)
            runs["b_host_tier"] = run_child(tierd_way)
            log(f"(b) from the host tier: {runs['b_host_tier']['seconds']:.2f} s")
            evict_from_gpu(client)
            # (c): retained by a process that exits, then twice the pool through it.
            run_child(dict(tierd_way, retain=True))
            pool = client.stats().gpu.budget_bytes
            copies = -(-2 * pool // results["model_bytes"])
            results["streamed_between_bytes"] = stream_others(client, checkpoint, copies)
            results["streamed_between_over_pool"] = results["streamed_between_bytes"] / pool
            results["retained_on_gpu_after_streaming"] = all(
                info.on_gpu for info in client.list_objects(MODEL))
            runs["c_retained"] = run_child(dict(tierd_way, retain=True))
            log(f"(c) retained: {runs['c_retained']['seconds']:.3f} s")
            # Where that time goes: the same again under cProfile (which slows Python code).
            runs["c_retained_profiled"] = run_child(dict(tierd_way, retain=True,
                                                         profile=profile_path))
            # Scale-out: a second process while the first holds the model.
            first, holder = run_child(dict(tierd_way, retain=True), hold=True)
            runs["scale_out_first"] = first
            misses = client.stats().gpu.misses
            runs["scale_out_second"] = run_child(dict(tierd_way, retain=True))
            runs["scale_out_second"]["daemon_gpu_misses"] = client.stats().gpu.misses - misses
            holder.stdin.close()
            holder.wait()
            log(f"scale-out: {runs['scale_out_second']['seconds']:.3f} s, "
                f"{runs['scale_out_second']['gpu_bytes_added'] / 1e9:.2f} GB added")
            # Wake: sleep, then wake, timed; the set's bytes over the wake's time.
            with client.session() as session:
                # Woken from the host tier, where a sleeping set lives: read back into it first
                # (the streaming above took its place there).
                keys = [info.key for info in client.list_objects(MODEL)]
                client.prefetch(keys, host_only=True)
                while not all(info.in_host_cache for info in client.list_objects(MODEL)):
                    time.sleep(0.1)
                session.sleep(MODEL)
                # Host memory for the engines of one model on the node: the host tier's one copy
                # (what wakes them), and each engine's own peak (no copy of the weights).
                results["host_memory"] = {
                    "host_tier_bytes": client.stats().host.used_bytes,
                    "engine_peak_rss_bytes": [runs["scale_out_first"]["peak_rss_bytes"],
                                              runs["scale_out_second"]["peak_rss_bytes"]]}
                # Until the bytes are on the GPU: a wake answers once the copies are under way,
                # and a lease's stream waits for its copy.
                torch.cuda.synchronize()
                start = time.perf_counter()
                woken = session.wake(MODEL)
                leases = session.fetch_many(keys)
                torch.cuda.synchronize()
                wake_seconds = time.perf_counter() - start
                session.release_many(leases)
                # The views opened the daemon's slabs in this process: closed with the last of
                # them, so that the daemon's restart below gets its pool's memory back.
                del leases
                results["wake"] = {"seconds": wake_seconds, "bytes": woken.bytes,
                                   "gb_per_s": woken.bytes / wake_seconds / 1e9,
                                   "moved": woken.moved,
                                   "over_copy": woken.bytes / wake_seconds / 1e9
                                   / results["copy_gb_per_s"]}
            log(f"wake: {results['wake']['gb_per_s']:.1f} GB/s "
                f"({results['wake']['over_copy']:.2f} of the copy), moved {woken.moved}")
            # Processed weights: the layers' linear weights quantized to int8 rows. Loading and
            # processing again, against mapping what a first start saved.
            identity = f"{checkpoint} int8-rows v1"
            processing = dict(tierd_way, way="process", retain=True, identity=identity)
            runs["processed_first_start"] = run_child(dict(processing, save=True))
            runs["processing_again"] = run_child(processing)
            runs["processed_cached"] = run_child(dict(tierd_way, way="processed",
                                                      identity=identity))
            results["processed_bytes_equal"] = (
                runs["processing_again"].pop("processed_digest")
                == runs["processed_cached"].pop("processed_digest"))
            runs["processed_first_start"].pop("processed_digest")
            log(f"processed weights: processing again {runs['processing_again']['seconds']:.2f} s, "
                f"cached {runs['processed_cached']['seconds']:.3f} s, bytes equal: "
                f"{results['processed_bytes_equal']}")
    except _SkipToRestart:
        pass
    finally:
        daemon.stop()
    # (c) again after a restart of the daemon: the retained set comes back from the model's files.
    # The driver frees the stopped daemon's pool a moment after it exits: wait for the room.
    write_results(dict(results, runs=runs), args.json)  # what was measured so far
    wait_for_gpu_memory(args.pool_gib << 30)
    daemon = Daemon(**daemon_settings)
    try:
        with tierd.Client(daemon.socket) as client, client.session() as session:
            start = time.perf_counter()
            session.retain(MODEL)
            results["restored_after_restart_seconds"] = time.perf_counter() - start
        runs["c_retained_after_restart"] = run_child(dict(tierd_way, socket=daemon.socket,
                                                          retain=True))
        log(f"(c) after a daemon restart: {runs['c_retained_after_restart']['seconds']:.3f} s "
            f"(set back on the GPU {results['restored_after_restart_seconds']:.1f} s after start)")
    finally:
        daemon.stop()
    results["runs"] = runs
    results["goal_c_seconds"] = 0.25
    # The first load against transformers' (goal: 4x faster) and as a rate, for the cold path's
    # (gpu_path_bench cold on tmpfs; goal: 0.9 of it).
    # With --after-restart-only the first load also retains the model (as (c) does after it).
    results["first_load_retained"] = args.after_restart_only
    first = runs["first_load"]["seconds"]
    results["first_load_gb_per_s"] = results["model_bytes"] / first / 1e9
    results["transformers_over_first_load"] = runs["a_transformers"]["seconds"] / first
    log(f"first load: {results['first_load_gb_per_s']:.1f} GB/s, "
        f"{results['transformers_over_first_load']:.2f}x faster than transformers (goal 4x)")
    results["first_load_streamed_no_read_ahead_gb_per_s"] = (
        results["model_bytes"] / runs["first_load_streamed_no_read_ahead"]["seconds"] / 1e9)
    streamed = runs["first_load_streamed"]["seconds"]
    results["first_load_streamed_gb_per_s"] = results["model_bytes"] / streamed / 1e9
    results["transformers_over_first_load_streamed"] = runs["a_transformers"]["seconds"] / streamed
    log(f"first load streamed, to the first logits: "
        f"{results['first_load_streamed_gb_per_s']:.1f} GB/s, "
        f"{results['transformers_over_first_load_streamed']:.2f}x faster than transformers "
        f"(goal 4x)")
    write_results(results, args.json)
    if os.path.exists(profile_path):
        with open(profile_path) as profile:
            log("(c)'s profile:\n" + profile.read())


if __name__ == "__main__":
    main()
