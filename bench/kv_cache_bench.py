#!/usr/bin/env python3
"""A Llama-architecture model (random weights, bf16, resident on the GPU) decoding with its KV
cache in tierd against transformers' own caches, and a second process continuing a saved prefix
against recomputing it. Same run, same GPU.

decode: a --context-token prompt (batch 1) is prefilled, then --new-tokens tokens are decoded
greedily, one forward per token, with
  (a) dynamic     transformers' DynamicCache: every layer's keys and values on the GPU
  (b) offloaded   DynamicCache(offloading=True): each layer offloaded to the CPU after its update,
                  the next prefetched on a side stream (transformers' offloaded cache)
  (c) tierd_cN    tierd.transformers.TierdCache of N-token chunks on a daemon whose GPU pool
                  holds the cache, for each N of --chunk-tokens
  (d) tierd_host_cN  the same on a daemon whose pool holds a few layers: the chunks come from its
                  host memory every step
Reported: decode tokens/s (the prefill timed apart, the best of --repeat runs), whether every
variant decoded the same tokens as (a), whether its own runs agree, and how far the first decoding
step's logits are from (a)'s (a random model's logits are close together: bf16 rounding can
change the greedy token).

prefix: this process prefills --context tokens into a TierdCache and saves it; a second process
builds the same model, opens the cache and computes the first token after --question more tokens,
against recomputing the whole prompt with a DynamicCache in that process, twice: with the prefix's
chunks where the first process left them (the daemon's GPU pool), and evicted to the daemon's host
memory before each try. Reported: the times to the first token (the median of --prefix-repeat
tries), their ratios to recomputing (goal <= 0.2), and whether the tokens agree.

--breakdown times the tierd caches' own calls on the CPU during one more decode of each, per layer;
--profile logs a cProfile of one more decode of each cache.

    bench/kv_cache_bench.py --tierd BUNDLE/bin/tierd --work-dir /tmp/kvb --json out.json
"""

import argparse
import collections
import faulthandler
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch
import transformers

import tierd
import tierd.transformers
from bench_harness import Daemon, add_common_arguments, log, results_header, timed, write_results


def build_model(args):
    """The same random model in every process (seeded, built on the GPU)."""
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.context + 4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


def prompt(args, tokens, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (1, tokens), generator=generator).cuda()


def decode(model, cache, ids, new_tokens):
    """Prefill `ids`, then greedy decoding one token per forward. Returns (tokens, prefill s,
    decode s, the first decoding forward's logits)."""
    with torch.no_grad():
        logits, prefill_s = timed(lambda: model(ids, past_key_values=cache, use_cache=True).logits)
        next_token = logits[:, -1:].argmax(-1)
        first_logits = None

        def steps():
            nonlocal next_token, first_logits
            out = [next_token]
            for _ in range(new_tokens - 1):
                logits = model(next_token, past_key_values=cache, use_cache=True).logits
                if first_logits is None:
                    first_logits = logits[:, -1].float()
                next_token = logits[:, -1:].argmax(-1)
                out.append(next_token)
            return torch.cat(out, dim=1)

        tokens, decode_s = timed(steps)
    return tokens, prefill_s, decode_s, first_logits


def kv_bytes(args, tokens):
    return 2 * args.layers * args.kv_heads * 128 * 2 * tokens


def run_decode(args, model, daemons, results):
    ids = prompt(args, args.context, seed=1)
    variants = {
        "dynamic": lambda: transformers.DynamicCache(config=model.config),
        "offloaded": lambda: transformers.DynamicCache(config=model.config, offloading=True),
    }
    sessions = []
    for daemon_name, daemon in daemons.items():
        for chunk in args.chunk_tokens:
            def make(daemon=daemon, chunk=chunk):
                session = tierd.Client(daemon.socket).session()
                sessions.append(session)
                return tierd.transformers.TierdCache(session, f"decode-{len(sessions)}",
                                                     config=model.config, chunk_tokens=chunk)
            variants[f"{daemon_name}_c{chunk}"] = make
    reference = None
    for name, make in variants.items():
        runs = []
        for _ in range(args.repeat):
            cache = make()
            runs.append(decode(model, cache, ids, args.new_tokens))
            if isinstance(cache, tierd.transformers.TierdCache):
                cache.close()
            del cache
            torch.cuda.empty_cache()
        if args.profile and name != "dynamic":
            profile_decode(name, make, model, ids, args.new_tokens)
        if args.breakdown and name.startswith("tierd"):
            results.setdefault("breakdown", {})[name] = breakdown_decode(name, make, model, ids,
                                                                         args.new_tokens)
        tokens, prefill_s, decode_s, first_logits = min(runs, key=lambda run: run[2])
        if reference is None:
            reference = (tokens, first_logits)
        results["decode"][name] = {
            "prefill_s": prefill_s, "decode_s": decode_s,
            "tokens_per_s": args.new_tokens / decode_s,
            "same_tokens_as_dynamic": bool(torch.equal(tokens, reference[0])),
            "repeats_decode_the_same_tokens": all(torch.equal(run[0], tokens) for run in runs),
            "first_step_max_logit_difference_from_dynamic":
                float((first_logits - reference[1]).abs().max())}
        figures = results["decode"][name]
        log(f"decode {name}: {figures['tokens_per_s']:.1f} tok/s (prefill {prefill_s:.2f} s), "
            f"same tokens as dynamic: {figures['same_tokens_as_dynamic']}, repeats agree: "
            f"{figures['repeats_decode_the_same_tokens']}, first step's logits differ by "
            f"{figures['first_step_max_logit_difference_from_dynamic']:.3g}")
    for session in sessions:
        session.close()
    offloaded = results["decode"]["offloaded"]["tokens_per_s"]
    for name, figures in results["decode"].items():
        figures["vs_offloaded"] = figures["tokens_per_s"] / offloaded


def profile_decode(name, make, model, ids, new_tokens):
    """Logs where one more decode's CPU time goes (cProfile: the functions with the most time of
    their own). A decode step is bound by this process's CPU when its GPU work is small: what the
    cache adds per layer shows here."""
    import cProfile
    import io
    import pstats
    cache = make()
    profiler = cProfile.Profile()
    profiler.enable()
    _, _, decode_s, _ = decode(model, cache, ids, new_tokens)
    profiler.disable()
    if isinstance(cache, tierd.transformers.TierdCache):
        cache.close()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    lines = [line for line in text.getvalue().splitlines() if line.strip()]
    log(f"profile of {name}'s decode ({new_tokens / decode_s:.1f} tok/s under the profiler):\n" +
        "\n".join(lines[-16:]))


class _CallTimes:
    """CPU time spent in the wrapped calls, per name: wrap(owner, attribute, name) times every
    call of owner.attribute until restore()."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.calls = collections.Counter()
        self.names = []  # in the order wrapped
        self._restore = []

    def wrap(self, owner, attribute, name):
        original = getattr(owner, attribute)

        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1
        setattr(owner, attribute, timed_call)
        self.names.append(name)
        self._restore.append((owner, attribute, original))

    def restore(self):
        for owner, attribute, original in reversed(self._restore):
            setattr(owner, attribute, original)
        self._restore = []


def breakdown_decode(name, make, model, ids, new_tokens):
    """One more decode with the cache's calls timed on the CPU: how much of a step the cache's own
    work takes (sending fetches, taking leases, concatenating, releasing, storing), per layer."""
    cache = make()
    store, session = cache.store, cache.store.session
    times = _CallTimes()
    times.wrap(cache, "update", "update (all of the below)")
    times.wrap(store, "prefetch", "prefetch (send the fetches)")
    times.wrap(tierd.PendingFetch, "result", "take a lease (answer wait + views)")
    times.wrap(session, "_lease_from", "  of which: make the lease")
    times.wrap(session, "_slab", "    its slab")
    times.wrap(session._lease_views, "views", "    its tensors' views")
    times.wrap(tierd._session, "tensor_views", "      of which: made anew")
    times.wrap(session, "_stream", "    the current stream")
    times.wrap(session, "_event", "    its ready event")
    times.wrap(session._backend, "wait_event", "    the stream's wait for it")
    times.wrap(session, "release_many", "release the leases")
    times.wrap(store, "_seal", "keep the tail, store full chunks")
    times.wrap(torch, "cat", "torch.cat (every caller)")
    try:
        _, _, decode_s, _ = decode(model, cache, ids, new_tokens)
    finally:
        times.restore()
        cache.close()
    # Needs a stored chunk: a context of at least one chunk.
    quiet_us = (_quiet_view_cost(session, store._chunk_key(0, 0)) if store._layers[0].sealed
                else (float("nan"), float("nan")))
    layer_steps = new_tokens * store.layers
    per_layer = {what: times.seconds[what] / layer_steps * 1e6 for what in times.names}
    figures = {"decode_s": decode_s, "tokens_per_s": new_tokens / decode_s,
               "step_ms": decode_s / new_tokens * 1e3, "us_per_layer": per_layer,
               "calls": dict(times.calls),
               "quiet_views_us": {"made": quiet_us[0], "kept": quiet_us[1]}}
    log(f"where {name}'s decode steps go ({figures['step_ms']:.2f} ms a step, {store.layers} "
        f"layers, {figures['tokens_per_s']:.1f} tok/s with the timers):\n" +
        "\n".join(f"  {what:40s} {us:8.1f} us a layer, {times.calls[what]} calls"
                   for what, us in per_layer.items()) +
        f"\n  one lease's views, with nothing else running: {quiet_us[0]:.1f} us made anew, "
        f"{quiet_us[1]:.1f} us kept")
    return figures


def _quiet_view_cost(session, key, tries=2000):
    """A lease's views of one fetched chunk, timed alone in a loop, made anew (tensor_views) and
    kept (the session's LeaseViews): what they cost this CPU when no reader thread or GPU work
    competes for it. Microseconds, (made, kept)."""
    pending = session.fetch_async(key)
    lease = pending.result()
    placed = pending._response.lease
    slab = session._slab(placed.slab_id)
    start = time.perf_counter()
    for _ in range(tries):
        tierd._session.tensor_views(lease.buffer, placed.tensors)
    made = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(tries):
        session._lease_views.views(placed.slab_id, slab, placed.offset, placed.length,
                                   placed.tensors, session._backend, session._stream(None))
    kept = time.perf_counter() - start
    lease.release()
    return made / tries * 1e6, kept / tries * 1e6


def run_prefix(args, model, daemon, results):
    ids = prompt(args, args.context, seed=2)
    session = tierd.Client(daemon.socket).session()
    cache = tierd.transformers.TierdCache(session, "prefix", config=model.config,
                                          chunk_tokens=max(args.chunk_tokens))
    with torch.no_grad():
        _, prefill_s = timed(lambda: model(ids, past_key_values=cache, use_cache=True))
    _, save_s = timed(cache.save)
    cache.close()
    session.close()
    log(f"prefix: {args.context} tokens prefilled in {prefill_s:.2f} s, saved in {save_s:.2f} s")
    command = [sys.executable, os.path.abspath(__file__), "--continue-prefix",
               "--socket", daemon.socket] + [f"--{k.replace('_', '-')}={v}" for k, v in
                                             (("context", args.context),
                                              ("prefix_repeat", args.prefix_repeat),
                                              ("question", args.question),
                                              ("layers", args.layers), ("hidden", args.hidden),
                                              ("kv_heads", args.kv_heads))]
    worker = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    if worker.returncode != 0:
        sys.exit(f"the continuing process failed:\n{worker.stderr}")
    continued = json.loads(worker.stdout.strip().splitlines()[-1])
    continued.update(prefill_s=prefill_s, save_s=save_s,
                     ratio=continued["reused_s"] / continued["recomputed_s"],
                     ratio_host=continued["reused_host_s"] / continued["recomputed_s"])
    results["prefix"] = continued
    for suffix, where in (("", "in the daemon's GPU pool"), ("_host", "in its host memory")):
        log(f"prefix continued by a second process, the chunks {where}: first token in "
            f"{continued[f'reused{suffix}_s'] * 1e3:.1f} ms (median of {args.prefix_repeat}) "
            f"reusing the saved cache, {continued['recomputed_s'] * 1e3:.1f} ms recomputing "
            f"({continued[f'ratio{suffix}']:.3f}x; goal <= 0.2; with the prefix's cache resident "
            f"{continued['resident_s'] * 1e3:.1f} ms); same token: "
            f"{continued[f'same_token{suffix}']}, same as computing the prefix first: "
            f"{continued[f'same_as_prefix_first{suffix}']}")


def continue_prefix(args):
    """The second process: the first token after the saved prefix and --question tokens, with the
    prefix's chunks where the first process left them (the daemon's GPU pool) and with them evicted
    to its host memory before each try; the median of --prefix-repeat tries each."""
    model = build_model(args)
    ids = torch.cat([prompt(args, args.context, seed=2), prompt(args, args.question, seed=3)], 1)
    question = ids[:, args.context:]
    session = tierd.Client(args.socket).session()
    placements = {}
    with torch.no_grad():
        model(ids[:, :64])  # warm the kernels up

        def reuse():
            cache = tierd.transformers.TierdCache.open(session, "prefix")
            logits = model(question, past_key_values=cache, use_cache=True).logits
            cache.close()
            return logits[:, -1].argmax(-1)
        reuse()  # maps the daemon's slabs and events into this process
        for placement in ("gpu", "host"):
            tries = []
            for _ in range(args.prefix_repeat):
                if placement == "host":
                    session.evict("kv/", tier="gpu")
                reused, reused_s = timed(reuse)
                tries.append(reused_s)
            placements[placement] = (reused, statistics.median(tries), tries)
        recomputed, recomputed_s = timed(lambda: model(
            ids, past_key_values=transformers.DynamicCache(config=model.config),
            use_cache=True).logits[:, -1].argmax(-1))
        own = transformers.DynamicCache(config=model.config)
        model(ids[:, :args.context], past_key_values=own, use_cache=True)
        prefix_first, resident_s = timed(lambda: model(
            question, past_key_values=own, use_cache=True).logits[:, -1].argmax(-1))
    session.close()
    result = {"recomputed_s": recomputed_s, "resident_s": resident_s}
    for placement, (reused, median_s, tries) in placements.items():
        suffix = "" if placement == "gpu" else "_" + placement
        result.update({f"reused{suffix}_s": median_s, f"reused{suffix}_tries_s": tries,
                       f"same_token{suffix}": bool(torch.equal(reused, recomputed)),
                       f"same_as_prefix_first{suffix}": bool(torch.equal(reused, prefix_first))})
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, tierd_required=False)
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--question", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--chunk-tokens", type=int, nargs="+", default=[1024, 4096],
                        help="TierdCache chunk sizes to run (the prefix uses the largest)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--prefix-repeat", type=int, default=5,
                        help="tries of the continued prefix per placement (the median is kept)")
    parser.add_argument("--profile", action="store_true",
                        help="log where one more decode of each cache spends its CPU time")
    parser.add_argument("--breakdown", action="store_true",
                        help="log where the CPU time of one more decode of each tierd cache goes")
    parser.add_argument("--continue-prefix", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.continue_prefix:
        return continue_prefix(args)
    if not (args.tierd and args.work_dir):
        parser.error("--tierd and --work-dir are needed")
    faulthandler.dump_traceback_later(1500, exit=True)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    cache_bytes = kv_bytes(args, args.context + args.new_tokens)
    log(f"KV cache of {args.context + args.new_tokens} tokens: {cache_bytes / 2**20:.0f} MiB")
    daemons = {
        "tierd": Daemon(args.tierd, args.work_dir, pool_bytes=2 * cache_bytes + (1 << 30),
                        slab_bytes=64 << 20, host_cache_bytes=4 * cache_bytes, name="gpu-pool"),
        "tierd_host": Daemon(args.tierd, args.work_dir, pool_bytes=256 << 20, slab_bytes=64 << 20,
                             host_cache_bytes=4 * cache_bytes, name="host-tier"),
    }
    results = {**results_header("kv_cache"), "transformers": transformers.__version__,
               "model": {"layers": args.layers, "hidden": args.hidden, "kv_heads": args.kv_heads,
                         "head_dim": 128, "dtype": "bf16"},
               "context": args.context, "new_tokens": args.new_tokens,
               "chunk_tokens": args.chunk_tokens, "kv_cache_bytes": cache_bytes, "decode": {}}
    try:
        model = build_model(args)
        run_decode(args, model, daemons, results)
        run_prefix(args, model, daemons["tierd"], results)
    finally:
        for daemon in daemons.values():
            daemon.stop()
    write_results(results, args.json)


if __name__ == "__main__":
    main()
