#!/usr/bin/env python3
"""The two-stage pipeline over two GPUs (python/examples/two_stage_pipeline.py) and the handoff
between two tierd daemons, measured.

Starts one tierd per GPU (--device=cuda:0 and cuda:1, each other's --peers) and, for each way the
daemons copy between them (--peer-copy=direct: GPU to GPU; host: through pinned host memory):

  pipeline   a DiT block stack (--blocks, split in half) over --windows windows:
               one_gpu      every block on GPU 0, no tierd (the reference outputs)
               overlap      stage 1 on GPU 0, stage 2 on GPU 1, window t handed over while GPU 0
                            runs window t+1
               no_overlap   the same, each window through both stages before the next starts
             median wall time of --repeat runs after one warm-up; outputs checked against one_gpu
  handoff    an object of each --sizes stored through GPU 0's daemon, then fetched through GPU 1's
             until its bytes are on GPU 1 (the fetch's RPCs, the peer's lease and the copy); against
             torch's tensor.to("cuda:1") (cudaMemcpyPeer) of the same bytes; median of --repeat

With --one-gpu both daemons and both stages share GPU 0 (the protocol without a second GPU).

    bench/pipeline_bench.py --tierd BUNDLE/bin/tierd --json out.json [--markdown out.md]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

# The harness first: it puts the examples' models on the path.
from bench_harness import Daemon, add_common_arguments, results_header, write_results  # noqa: E402
import tierd  # noqa: E402
from dit_model import DiT  # noqa: E402
from two_stage_pipeline import (TwoStagePipeline, compare, reference_outputs,  # noqa: E402
                                windows)

MiB = 1 << 20


def start_daemons(tierd_bin, work, devices, peer_copy, gpu_pool, host_cache):
    """One tierd per device, each naming every socket in --peers."""
    names = [f"gpu{i}" for i in range(len(devices))]
    peers = ",".join(os.path.join(work, f"{name}.sock") for name in names)
    daemons = []
    try:
        for name, device in zip(names, devices):
            daemons.append(Daemon(tierd_bin, work, gpu_pool, gpu_pool, host_cache, device=device,
                                  name=name,
                                  extra_flags=(f"--peers={peers}", f"--peer-copy={peer_copy}",
                                               "--peer-host-buffer-bytes=1GiB")))
    except BaseException:
        for daemon in daemons:
            daemon.stop()
        raise
    return daemons


def median_time(fn, repeat, synchronize):
    times = []
    for _ in range(repeat):
        synchronize()
        started = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def bench_pipeline(args, sessions, dtype):
    device0, device1 = sessions[0].device, sessions[1].device

    def synchronize():
        torch.cuda.synchronize(device0)
        torch.cuda.synchronize(device1)

    torch.manual_seed(0)
    model = DiT(blocks=args.blocks, dim=args.dim, ffn_dim=args.ffn_dim, heads=args.heads).eval()
    model = model.to(dtype)
    patches, context, timestep = windows(args.windows, args.tokens, 16, 512, 32,
                                         torch.device("cpu"))
    patches = [p.to(dtype) for p in patches]
    context = context.to(dtype)
    reference_model = DiT(blocks=args.blocks, dim=args.dim, ffn_dim=args.ffn_dim,
                          heads=args.heads).eval().to(dtype)
    reference_model.load_state_dict(model.state_dict())
    reference_model = reference_model.to(device0)
    patches0 = [p.to(device0) for p in patches]
    context0, timestep0 = context.to(device0), timestep.to(device0)
    expected = reference_outputs(reference_model, patches0, context0, timestep0, device0)
    one_gpu, one_gpu_runs = median_time(
        lambda: reference_outputs(reference_model, patches0, context0, timestep0, device0),
        args.repeat, synchronize)

    pipeline = TwoStagePipeline(model, args.blocks // 2, sessions[0], sessions[1],
                                prefix="bench/activations")
    results = {"one_gpu_s": one_gpu, "one_gpu_runs_s": one_gpu_runs}
    for name, overlap in (("overlap", True), ("no_overlap", False)):
        outputs = pipeline.run(patches0, context0, timestep0, overlap=overlap)  # warm-up
        equal, worst = compare(expected, outputs)
        seconds, runs = median_time(
            lambda: pipeline.run(patches0, context0, timestep0, overlap=overlap), args.repeat,
            synchronize)
        results[f"{name}_s"] = seconds
        results[f"{name}_runs_s"] = runs
        results[f"{name}_outputs_equal"] = equal
        results[f"{name}_largest_difference"] = worst
    with torch.no_grad():
        activation_bytes = sum(t.numel() * t.element_size() for t in pipeline.stage1.embed(
            patches0[0], context0, timestep0))
    results["activation_bytes_per_window"] = activation_bytes
    results["speedup_overlap_vs_one_gpu"] = one_gpu / results["overlap_s"]
    results["speedup_overlap_vs_no_overlap"] = results["no_overlap_s"] / results["overlap_s"]
    return results


def bench_handoff(args, sessions, clients):
    device0, device1 = sessions[0].device, sessions[1].device
    rows = []
    for size_mib in args.sizes:
        size = size_mib * MiB
        source = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device0)
        key = f"bench/handoff-{size_mib}"
        sessions[0].store_async(key, source, spillable=False)
        sessions[0].wait_committed(key)
        stream1 = torch.cuda.Stream(device1)
        check = None

        def handoff():
            nonlocal check
            lease = sessions[1].fetch(key, stream=stream1)
            stream1.synchronize()
            if check is None:
                check = torch.equal(lease.tensor.to(device0), source)
            lease.release(stream1)

        def peer_copy():
            source.to(device1, non_blocking=True)

        def synchronize():
            torch.cuda.synchronize(device0)
            torch.cuda.synchronize(device1)

        handoff()  # warm-up: opens the handles
        handoff_s, handoff_runs = median_time(handoff, args.repeat, synchronize)
        peer_copy()
        copy_s, copy_runs = median_time(peer_copy, args.repeat, synchronize)
        rows.append({
            "bytes": size, "handoff_s": handoff_s, "handoff_runs_s": handoff_runs,
            "handoff_gb_s": size / handoff_s / 1e9, "memcpy_peer_s": copy_s,
            "memcpy_peer_runs_s": copy_runs, "memcpy_peer_gb_s": size / copy_s / 1e9,
            "bytes_equal": bool(check)})
        clients[0].evict(key, tier="all")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, json_required=True)
    parser.add_argument("--markdown", help="also write a markdown table here")
    parser.add_argument("--one-gpu", action="store_true", help="both daemons on GPU 0")
    parser.add_argument("--peer-copy", default="direct,host",
                        help="comma-separated --peer-copy values to measure")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--dim", type=int, default=1536)
    parser.add_argument("--ffn-dim", type=int, default=8960)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per window")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sizes", default="4,64,256", help="handoff sizes in MiB")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if not torch.cuda.is_available():
        print("pipeline_bench: needs CUDA", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count()
    if not args.one_gpu and gpus < 2:
        print(f"pipeline_bench: {gpus} GPU(s) visible; two needed (or --one-gpu)",
              file=sys.stderr)
        return 2
    devices = ["cuda:0", "cuda:0"] if args.one_gpu else ["cuda:0", "cuda:1"]
    work = args.work_dir or tempfile.mkdtemp(prefix="tierd-pipeline-bench-")
    os.makedirs(work, exist_ok=True)
    largest = max(args.sizes) * MiB
    gpu_pool = f"{max(1 << 30, 4 * largest)}"
    host_cache = f"{max(4 << 30, 4 * largest)}"
    result = {
        **results_header("pipeline"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "peer_access_0_to_1": (torch.cuda.can_device_access_peer(0, 1) if gpus > 1 else None),
        "torch": torch.__version__,
        "model": {"blocks": args.blocks, "dim": args.dim, "ffn_dim": args.ffn_dim,
                  "heads": args.heads, "tokens_per_window": args.tokens,
                  "windows": args.windows, "dtype": "bfloat16"},
        "repeat": args.repeat,
        "devices": devices,
        "runs": {},
    }
    status = 0
    for peer_copy in args.peer_copy.split(","):
        print(f"pipeline_bench: --peer-copy={peer_copy}", flush=True)
        daemons = start_daemons(args.tierd, work, devices, peer_copy, gpu_pool, host_cache)
        try:
            clients = [tierd.Client(d.socket, client_name=f"pipeline_bench {peer_copy}")
                       for d in daemons]
            sessions = [c.session() for c in clients]
            run = {"pipeline": bench_pipeline(args, sessions, torch.bfloat16),
                   "handoff": bench_handoff(args, sessions, clients)}
            stats = clients[1].stats()
            run["receiver_stats"] = {"peer_fetches": stats.peer_fetches,
                                     "peer_fetches_through_host": stats.peer_fetches_through_host,
                                     "bytes_peer_to_gpu": stats.bytes_peer_to_gpu}
            for s in sessions:
                s.close()
            for c in clients:
                c.close()
        finally:
            # The borrower first: a daemon's shutdown grace waits for its peers' sessions.
            for daemon in reversed(daemons):
                daemon.stop()
        result["runs"][peer_copy] = run
        p = run["pipeline"]
        print(f"  pipeline: one GPU {p['one_gpu_s'] * 1e3:.1f} ms, overlap "
              f"{p['overlap_s'] * 1e3:.1f} ms (equal: {p['overlap_outputs_equal']}), no overlap "
              f"{p['no_overlap_s'] * 1e3:.1f} ms (equal: {p['no_overlap_outputs_equal']})",
              flush=True)
        for row in run["handoff"]:
            print(f"  handoff {row['bytes'] // MiB} MiB: {row['handoff_gb_s']:.1f} GB/s "
                  f"(memcpy peer {row['memcpy_peer_gb_s']:.1f} GB/s), bytes equal: "
                  f"{row['bytes_equal']}", flush=True)
        if not (p["overlap_outputs_equal"] and p["no_overlap_outputs_equal"] and
                all(row["bytes_equal"] for row in run["handoff"])):
            status = 1
    write_results(result, args.json)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(markdown(result))
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return status


def markdown(result):
    lines = [f"# Two-stage pipeline and handoff, {result['date']}", "",
             f"GPUs: {', '.join(result['gpus'])}; daemons on {', '.join(result['devices'])}; "
             f"peer access 0→1: {result['peer_access_0_to_1']}; torch {result['torch']}", "",
             f"Command: `{result['command']}`", "",
             f"Model: {result['model']}; median of {result['repeat']} runs.", "",
             "| --peer-copy | one GPU (ms) | pipeline, overlap (ms) | pipeline, no overlap (ms) "
             "| overlap vs one GPU | outputs equal |",
             "|---|---|---|---|---|---|"]
    for name, run in result["runs"].items():
        p = run["pipeline"]
        lines.append(f"| {name} | {p['one_gpu_s'] * 1e3:.1f} | {p['overlap_s'] * 1e3:.1f} | "
                     f"{p['no_overlap_s'] * 1e3:.1f} | {p['speedup_overlap_vs_one_gpu']:.2f}x | "
                     f"{p['overlap_outputs_equal'] and p['no_overlap_outputs_equal']} |")
    lines += ["", "| --peer-copy | size | handoff (GB/s) | cudaMemcpyPeer (GB/s) | bytes equal |",
              "|---|---|---|---|---|"]
    for name, run in result["runs"].items():
        for row in run["handoff"]:
            lines.append(f"| {name} | {row['bytes'] // MiB} MiB | {row['handoff_gb_s']:.1f} | "
                         f"{row['memcpy_peer_gb_s']:.1f} | {row['bytes_equal']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
