#!/usr/bin/env python3
"""Streams 16 Wan-14B-sized DiT blocks (dim 5120, FFN 13824, 40 heads, bf16, 670 MiB each;
self-attention, cross-attention over 512 context tokens, FFN) through tierd and compares, in the
same run on the same GPU:

  (a) resident    all weights on the GPU
  (b) tierd       tierd.torch.stream_weights, prefetch depth 2, from a daemon whose GPU pool holds
                  4 blocks (the host cache holds the model, compressed: docs/COMPRESSION.md)
      tierd_unchecked  the same, answering fetches when decodes are enqueued
                  (--check-decodes-before-serving=false)
      tierd_small_scratch  the same, decoding through 256 MiB of scratch a copy stream
                  (--decode-scratch-mib; 1024 by default): objects decoded in pieces of 116 MiB
      tierd_raw   the same from a daemon with --compress-weights=false
  (c) two_slot    in-process: pinned host copies, two GPU slots, block i+1 copied on a side stream
                  while block i computes (the usual in-process offload)
  (d) sync        in-process: each block copied from pinned memory on the compute stream, then run
  (e) accelerate  accelerate.cpu_offload (per-module hooks, weights in pageable host memory)

for T=4096 and T=16384 tokens; then four processes streaming the model from one daemon whose pool
holds it (one GPU copy of each block, shared) against one process doing the same.

Weights are N(0, 0.02²) as transformers initialises linear layers (--init=normal; --init=torch
keeps torch's default uniform init), norms' weights ones. Each pass is one forward over the 16
blocks; passes run back to back as a denoising loop would and
each is timed with CUDA events. Reported: the median pass after --warmup passes.

    bench/stream_weights_bench.py --tierd BUNDLE/bin/tierd --work-dir /tmp/swb --json out.json
"""

import argparse
import faulthandler
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

# The harness first: it puts the examples' models on the path.
from bench_harness import (Daemon, add_common_arguments, log, results_header,  # noqa: E402
                           wait_for_compression, write_results)
import tierd  # noqa: E402
import tierd.torch  # noqa: E402
from dit_model import DiTBlock, save_safetensors  # noqa: E402

MODEL = "wan-blocks"
CONTEXT_TOKENS = 512


class Blocks(nn.Module):
    """Only the transformer blocks: what streaming moves."""

    def __init__(self, count, dim, ffn_dim, heads):
        super().__init__()
        self.blocks = nn.ModuleList(DiTBlock(dim, ffn_dim, heads) for _ in range(count))

    def forward(self, x, context, time):
        for block in self.blocks:
            x = block(x, context, time)
        return x


def meta_blocks(args):
    """The blocks with no weights of their own (bf16, on the meta device): what streaming fills."""
    with torch.device("meta"):
        return Blocks(args.blocks, args.dim, args.ffn_dim, args.heads).to(torch.bfloat16).eval()


def make_inputs(args, tokens, device):
    generator = torch.Generator(device=device).manual_seed(5)
    shape = (1, tokens, args.dim)
    return (torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16),
            torch.randn((1, CONTEXT_TOKENS, args.dim), generator=generator, device=device,
                        dtype=torch.bfloat16),
            torch.randn((1, 6, args.dim), generator=generator, device=device,
                        dtype=torch.bfloat16) * 0.1)


def time_passes(run_pass, passes):
    """Runs `passes` passes back to back; the duration of each in ms, from CUDA events."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(passes + 1)]
    events[0].record()
    output = None
    for index in range(passes):
        output = run_pass()
        events[index + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(passes)], output


def measure(run_pass, args):
    times, output = time_passes(run_pass, args.warmup + args.passes)
    measured = times[args.warmup:]
    result = {"median_ms": statistics.median(measured), "min_ms": min(measured),
              "max_ms": max(measured), "passes_ms": measured}
    if args.profile:
        result["profile"] = profile_pass(run_pass)
    return result, output


def profile_pass(run_pass):
    """Where one more pass's time goes on the GPU, from torch.profiler: this process's kernels'
    busy time (the union of their intervals) and the gaps between them, the largest first with the
    kernels around them. The daemon's copies run in its own process and are not among them: a gap
    is the GPU waiting (for a copy's event, or for this process to enqueue work)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        run_pass()
        torch.cuda.synchronize()
    kernels = sorted((event.time_range.start, event.time_range.end, event.name)
                     for event in profiler.events()
                     if event.device_type == torch.autograd.DeviceType.CUDA
                     and not event.name.startswith("Memcpy") and not event.name.startswith("Memset"))
    if not kernels:
        return {}
    busy, gaps = 0.0, []
    start, end, name = kernels[0]
    for next_start, next_end, next_name in kernels[1:]:
        if next_start > end:
            busy += end - start
            gaps.append((next_start - end, name, next_name))
            start = next_start
        end, name = max(end, next_end), next_name if next_end >= end else name
    busy += end - start
    gaps.sort(reverse=True)
    return {"span_ms": (end - kernels[0][0]) / 1e3, "kernel_busy_ms": busy / 1e3,
            "gap_ms": sum(gap for gap, _, _ in gaps) / 1e3, "gaps": len(gaps),
            "largest_gaps": [{"ms": gap / 1e3, "after": before[:60], "before": after[:60]}
                             for gap, before, after in gaps[:8]]}


def describe_profile(profile):
    if not profile:
        return ""
    largest = ", ".join(f"{gap['ms']:.2f}" for gap in profile["largest_gaps"][:4])
    return (f"; profiled pass: kernels busy {profile['kernel_busy_ms']:.1f} of "
            f"{profile['span_ms']:.1f} ms, {profile['gaps']} gaps {profile['gap_ms']:.1f} ms "
            f"(largest {largest} ms)")


# ---- (c) and (d): in-process offload from pinned memory -------------------------------------

class PinnedBlocks:
    """Each block's weights in one pinned host buffer, with views per parameter."""

    def __init__(self, module):
        self.module = module
        self.layouts = []
        self.host = []
        for block in module.blocks:
            layout, offset = [], 0
            for name, parameter in block.named_parameters():
                size = parameter.numel() * parameter.element_size()
                layout.append((name, parameter, offset, size, tuple(parameter.shape)))
                offset += -(-size // 256) * 256
            buffer = torch.empty(offset, dtype=torch.uint8, pin_memory=True)
            for name, parameter, start, size, _ in layout:
                buffer[start:start + size].copy_(parameter.detach().reshape(-1).view(torch.uint8))
            self.layouts.append(layout)
            self.host.append(buffer)
        self.bytes = max(buffer.numel() for buffer in self.host)

    def point_at(self, index, slot):
        for name, parameter, start, size, shape in self.layouts[index]:
            parameter.data = slot[start:start + size].view(parameter.dtype).view(shape)


def two_slot_pass(pinned, slots, copy_stream, ready, free, inputs):
    """Block i+1 is copied into the other slot on copy_stream while block i computes."""
    compute = torch.cuda.current_stream()
    count = len(pinned.host)

    def copy(index):
        slot = index % 2
        copy_stream.wait_event(free[slot])
        with torch.cuda.stream(copy_stream):
            slots[slot][:pinned.host[index].numel()].copy_(pinned.host[index], non_blocking=True)
        ready[slot].record(copy_stream)

    x, context, time_embedding = inputs
    copy(0)
    for index, block in enumerate(pinned.module.blocks):
        slot = index % 2
        compute.wait_event(ready[slot])
        pinned.point_at(index, slots[slot])
        if index + 1 < count:
            copy(index + 1)
        x = block(x, context, time_embedding)
        free[slot].record(compute)
    return x


def sync_pass(pinned, slot, inputs):
    x, context, time_embedding = inputs
    for index, block in enumerate(pinned.module.blocks):
        slot[:pinned.host[index].numel()].copy_(pinned.host[index], non_blocking=True)
        pinned.point_at(index, slot)
        x = block(x, context, time_embedding)
    return x


# ---- the daemon ---------------------------------------------------------------------------

def initialise(module, args):
    """Gives the weights the values --init asks for (deterministic: seeded)."""
    if args.init != "normal":
        return
    generator = torch.Generator(device=next(module.parameters()).device).manual_seed(1)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.02, generator=generator)
            elif "norm" in name and name.endswith("weight"):
                parameter.fill_(1.0)
            else:
                parameter.zero_()




def warm_host_cache(client, keys):
    """Reads the model into the daemon's host cache and waits until it is all there."""
    client.prefetch(keys, host_only=True)
    started = time.monotonic()
    last_report = started
    progress = (-1, started)  # (bytes read, when that changed)
    while True:
        cached = sum(info.in_host_cache for info in client.list_objects(MODEL))
        if cached == len(keys):
            break
        now = time.monotonic()
        stats = client.stats()
        if stats.bytes_disk_to_host != progress[0]:
            progress = (stats.bytes_disk_to_host, now)
        elif now - progress[1] > 30:
            sys.exit(f"the model stopped reaching the host cache at {cached}/{len(keys)} objects")
        if now - last_report > 5:
            log(f"  {cached}/{len(keys)} objects in the host cache, "
                f"{stats.bytes_disk_to_host / 2**30:.1f} GiB read")
            last_report = now
        time.sleep(0.2)
    log(f"  the model is in the host cache after {time.monotonic() - started:.1f} s")


def run_streamed(args, socket, tokens, reference):
    log(f"T={tokens} (b) streaming through tierd")
    client = tierd.Client(socket)
    module = meta_blocks(args)
    inputs = make_inputs(args, tokens, torch.device("cuda"))
    with tierd.torch.stream_weights(module, client, MODEL, prefetch_depth=args.prefetch_depth):
        with torch.no_grad():
            result, output = measure(lambda: module(*inputs), args)
    client.close()
    result["output_equal"] = bool(torch.equal(output, reference))
    return result


# ---- four processes -------------------------------------------------------------------------

def worker(args):
    """One of the processes streaming at once: ready, wait for 'go', run, report."""
    client = tierd.Client(args.socket)
    module = meta_blocks(args)
    inputs = make_inputs(args, args.tokens[0], torch.device("cuda"))
    with tierd.torch.stream_weights(module, client, MODEL, prefetch_depth=args.prefetch_depth):
        with torch.no_grad():
            time_passes(lambda: module(*inputs), 1)  # first pass: the blocks come to the GPU
            print("ready", flush=True)
            sys.stdin.readline()
            started = time.perf_counter()
            times, _ = time_passes(lambda: module(*inputs), args.passes)
            elapsed = time.perf_counter() - started
    client.close()
    print(json.dumps({"elapsed_s": elapsed, "passes": args.passes,
                      "median_ms": statistics.median(times),
                      "max_memory_allocated": torch.cuda.max_memory_allocated()}), flush=True)


def run_processes(args, socket, count):
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--socket", socket,
               "--tokens", str(args.tokens[0]), "--passes", str(max(args.passes, 10)),
               "--prefetch-depth", str(args.prefetch_depth), "--blocks", str(args.blocks),
               "--dim", str(args.dim), "--ffn-dim", str(args.ffn_dim), "--heads", str(args.heads)]
    workers = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for _ in range(count)]
    for process in workers:
        line = process.stdout.readline().strip()
        if line != "ready":
            sys.exit(f"a worker failed to start: {line!r}")
    started = time.perf_counter()
    for process in workers:
        process.stdin.write("go\n")
        process.stdin.flush()
    reports = [json.loads(process.stdout.readline()) for process in workers]
    wall = time.perf_counter() - started
    for process in workers:
        process.wait()
    passes = sum(report["passes"] for report in reports)
    return {"processes": count, "wall_s": wall, "passes": passes,
            "passes_per_s": passes / wall, "workers": reports}


# ---- main -----------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, tierd_required=False)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--dim", type=int, default=5120)
    parser.add_argument("--ffn-dim", type=int, default=13824)
    parser.add_argument("--heads", type=int, default=40)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prefetch-depth", type=int, default=2)
    parser.add_argument("--modes", default="resident,tierd,tierd_unchecked,tierd_raw,two_slot,"
                                           "sync,accelerate,processes")
    parser.add_argument("--init", choices=("normal", "torch"), default="normal",
                        help="the weights' values: N(0, 0.02^2) as transformers initialises, or "
                             "torch's default init")
    parser.add_argument("--profile", action="store_true",
                        help="profile one more pass of each measured run (GPU busy time and gaps)")
    parser.add_argument("--watchdog", type=float, default=1200,
                        help="seconds after which a stuck run prints its stacks and exits")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if not (args.tierd and args.work_dir):
        parser.error("--tierd and --work-dir are needed")
    # A hang shows where it is: every thread's stack after --watchdog seconds, then exit.
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    modes = args.modes.split(",")
    os.makedirs(args.work_dir, exist_ok=True)
    device = torch.device("cuda")

    log(f"building {args.blocks} blocks (dim {args.dim}, FFN {args.ffn_dim}) on the GPU")
    torch.manual_seed(0)
    with torch.device(device):
        module = Blocks(args.blocks, args.dim, args.ffn_dim, args.heads).to(torch.bfloat16).eval()
    initialise(module, args)
    block_bytes = sum(p.numel() * p.element_size() for p in module.blocks[0].parameters())
    model_dir = os.path.join(args.work_dir, "model")
    os.makedirs(model_dir, exist_ok=True)
    log(f"saving {args.blocks * block_bytes / 2**30:.2f} GiB of safetensors to {model_dir}")
    save_safetensors(module.state_dict(), os.path.join(model_dir, "model.safetensors"))

    results = {**results_header("stream_weights"),
               "blocks": args.blocks, "dim": args.dim, "ffn_dim": args.ffn_dim,
               "heads": args.heads, "block_mib": block_bytes / 2**20,
               "context_tokens": CONTEXT_TOKENS, "passes": args.passes, "warmup": args.warmup,
               "prefetch_depth": args.prefetch_depth, "init": args.init,
               "command": " ".join(sys.argv),
               "sizes": {}}
    references = {}
    for tokens in args.tokens:
        inputs = make_inputs(args, tokens, device)
        with torch.no_grad():
            result, references[tokens] = measure(lambda: module(*inputs), args)
        results["sizes"][str(tokens)] = {"resident": result}
        log(f"T={tokens} (a) resident: {result['median_ms']:.1f} ms"
            f"{describe_profile(result.get('profile'))}")
    results["resident_gpu_bytes"] = args.blocks * block_bytes

    pinned = None
    if "two_slot" in modes or "sync" in modes:
        module = module.cpu()
        torch.cuda.empty_cache()
        pinned = PinnedBlocks(module)
        for block in module.blocks:
            for parameter in block.parameters():
                parameter.data = torch.empty(0, dtype=parameter.dtype, device=device)
        torch.cuda.empty_cache()
        slots = [torch.empty(pinned.bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        copy_stream = torch.cuda.Stream()
        ready = [torch.cuda.Event() for _ in range(2)]
        free = [torch.cuda.Event() for _ in range(2)]
        for slot in range(2):
            free[slot].record()
        for tokens in args.tokens:
            inputs = make_inputs(args, tokens, device)
            entry = results["sizes"][str(tokens)]
            with torch.no_grad():
                if "two_slot" in modes:
                    entry["two_slot"], output = measure(
                        lambda: two_slot_pass(pinned, slots, copy_stream, ready, free, inputs),
                        args)
                    entry["two_slot"]["output_equal"] = bool(torch.equal(output,
                                                                         references[tokens]))
                    log(f"T={tokens} (c) two-slot: {entry['two_slot']['median_ms']:.1f} ms"
                        f"{describe_profile(entry['two_slot'].get('profile'))}")
                if "sync" in modes:
                    entry["sync"], output = measure(lambda: sync_pass(pinned, slots[0], inputs),
                                                    args)
                    entry["sync"]["output_equal"] = bool(torch.equal(output, references[tokens]))
                    log(f"T={tokens} (d) sync: {entry['sync']['median_ms']:.1f} ms")
        results["two_slot_gpu_bytes"] = 2 * pinned.bytes
        del slots
    del module
    torch.cuda.empty_cache()

    for mode, flags in (("tierd", ["--compress-weights", "--compress-threads=8"]),
                        ("tierd_unchecked", ["--compress-weights", "--compress-threads=8",
                                             "--check-decodes-before-serving=false"]),
                        ("tierd_small_scratch", ["--compress-weights", "--compress-threads=8",
                                                 "--decode-scratch-mib=256"]),
                        ("tierd_raw", ["--compress-weights=false"])):
        if mode not in modes:
            continue
        # Whole MiB: the daemon takes slabs of whole pages.
        pool = 4 * ((block_bytes >> 20) + 2) << 20
        daemon = Daemon(args.tierd, args.work_dir, pool_bytes=pool, slab_bytes=pool // 2,
                        host_cache_bytes=args.blocks * block_bytes + (2 << 30), extra_flags=flags)
        try:
            client = tierd.Client(daemon.socket)
            if any(m.name == MODEL for m in client.list_models()):
                client.drop_model(MODEL)  # from an earlier run: its file was written anew
            client.register_model(MODEL, model_dir, grouping="block")
            log(f"warming the daemon's host cache ({mode})")
            keys = [info.key for info in client.list_objects(MODEL)]
            warm_host_cache(client, keys)
            if mode != "tierd_raw":
                results[f"{mode}_host_compression"] = wait_for_compression(client, len(keys))
            results[f"{mode}_gpu_pool_bytes"] = pool
            for tokens in args.tokens:
                before = client.stats()
                entry = results["sizes"][str(tokens)]
                entry[mode] = run_streamed(args, daemon.socket, tokens, references[tokens])
                after = client.stats()
                entry[mode]["bytes_host_to_gpu"] = (after.bytes_host_to_gpu -
                                                    before.bytes_host_to_gpu)
                entry[mode]["bytes_host_to_gpu_compressed"] = (
                    after.bytes_host_to_gpu_compressed - before.bytes_host_to_gpu_compressed)
                entry[mode]["decode_failures"] = after.decode_failures - before.decode_failures
                entry[mode]["decode_seconds_all_runs"] = (
                    (after.decode_micros - before.decode_micros) / 1e6)
                log(f"T={tokens} (b) {mode}: {entry[mode]['median_ms']:.1f} ms, outputs equal: "
                    f"{entry[mode]['output_equal']}"
                    f"{describe_profile(entry[mode].get('profile'))}")
            client.close()
        finally:
            daemon.stop()

    if "processes" in modes:
        pool = (args.blocks * ((block_bytes >> 20) + 2) << 20) + (1 << 30)
        daemon = Daemon(args.tierd, args.work_dir, pool_bytes=pool, slab_bytes=4 << 30,
                        host_cache_bytes=args.blocks * block_bytes + (2 << 30))
        try:
            client = tierd.Client(daemon.socket)
            warm_host_cache(client, [info.key for info in client.list_objects(MODEL)])
            shared = {"gpu_pool_bytes": pool, "tokens": args.tokens[0]}
            for count in (1, 4):
                before = client.stats()
                shared[str(count)] = run_processes(args, daemon.socket, count)
                after = client.stats()
                shared[str(count)]["bytes_host_to_gpu"] = (after.bytes_host_to_gpu -
                                                           before.bytes_host_to_gpu)
                shared[str(count)]["gpu_used_bytes"] = after.gpu.used_bytes
                log(f"{count} process(es): {shared[str(count)]['passes_per_s']:.2f} passes/s")
            shared["aggregate_vs_one"] = shared["4"]["passes_per_s"] / shared["1"]["passes_per_s"]
            shared["private_resident_copies_bytes"] = 4 * args.blocks * block_bytes
            results["processes"] = shared
            client.close()
        finally:
            daemon.stop()

    if "accelerate" in modes:
        import accelerate

        log("accelerate.cpu_offload")
        torch.manual_seed(0)
        with torch.device(device):
            module = Blocks(args.blocks, args.dim, args.ffn_dim, args.heads).to(
                torch.bfloat16).eval()
        initialise(module, args)
        module = module.cpu()
        accelerate.cpu_offload(module, execution_device=device)
        quick = argparse.Namespace(**vars(args))
        quick.passes, quick.warmup = 2, 1
        for tokens in args.tokens:
            inputs = make_inputs(args, tokens, device)
            with torch.no_grad():
                entry, output = measure(lambda: module(*inputs), quick)
            entry["output_equal"] = bool(torch.equal(output, references[tokens]))
            entry["accelerate"] = accelerate.__version__
            results["sizes"][str(tokens)]["accelerate"] = entry
            log(f"T={tokens} (e) accelerate: {entry['median_ms']:.1f} ms")

    for tokens, entry in results["sizes"].items():
        for mode in ("tierd", "tierd_unchecked", "tierd_small_scratch", "tierd_raw"):
            if mode not in entry:
                continue
            entry[f"{mode}_vs_resident"] = (entry[mode]["median_ms"] /
                                            entry["resident"]["median_ms"])
            if "two_slot" in entry:
                entry[f"{mode}_vs_two_slot"] = (entry[mode]["median_ms"] /
                                                entry["two_slot"]["median_ms"])
    print(json.dumps(results, indent=2))
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
