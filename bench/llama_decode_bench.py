#!/usr/bin/env python3
"""Greedy decoding with a Llama-architecture checkpoint (random weights, bf16, about 2.2 GB) whose
weights stream from a daemon with a 1 GiB GPU pool: every decoding step brings the blocks the pool
cannot keep from the daemon's host memory. The model comes from tierd.transformers.from_pretrained
(each --prefetch-depth in turn), first from a daemon keeping the weights raw, then from one
keeping them compressed in host memory (--compress-weights: docs/COMPRESSION.md), then from one
answering fetches of compressed objects before their decodes are checked. Compared in the same
run, on the same GPU:

  copy rate   torch's host -> GPU copy of a pinned buffer of one block's size
  resident    the same checkpoint all on the GPU (tokens/s, and the tokens, which must be equal)
  accelerate  accelerate.cpu_offload of the same weights (when accelerate is installed)

Reported: tokens/s of each; for tierd, the bytes the daemon delivered host -> GPU per second of
decoding over the copy rate (raw goal >= 0.95: streaming runs at the copy engine's speed), and the
compressed daemon's tokens/s over the raw one's (goal >= 1.3) with the same tokens.

    bench/llama_decode_bench.py --tierd BUNDLE/bin/tierd --work-dir /tmp/ldb --json out.json
"""

import argparse
import faulthandler
import os
import shutil
import sys
import time

import torch
import transformers

import tierd
import tierd.transformers
from bench_harness import (Daemon, add_common_arguments, generate, log, pinned_copy_rate,
                           results_header, wait_for_compression, write_results)

MODEL = "llama"


def build_checkpoint(args, directory):
    """A seeded random Llama of --layers layers saved as sharded safetensors; returns it, on the
    GPU."""
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=4, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(directory, max_shard_size="512MB")
    return model.eval()


def wait_in_host_cache(client):
    """Reads the model into the daemon's host memory, so that decoding streams from there; returns
    its keys."""
    keys = [info.key for info in client.list_objects(MODEL)]
    client.prefetch(keys, host_only=True)
    deadline = time.monotonic() + 300
    while sum(info.in_host_cache for info in client.list_objects(MODEL)) < len(keys):
        if time.monotonic() > deadline:
            sys.exit("the model did not reach the daemon's host cache in 300 s")
        time.sleep(0.2)
    return keys


def stream_from_daemon(args, mode, flags, checkpoint, ids, expected, copy_gb_per_s):
    """Decodes through a daemon started with `flags`, each --prefetch-depth in turn; returns the
    figures of each depth (and the host cache's compression)."""
    model_bytes = sum(os.path.getsize(os.path.join(checkpoint, name))
                      for name in os.listdir(checkpoint) if name.endswith(".safetensors"))
    directory = os.path.join(args.work_dir, mode)
    os.makedirs(directory, exist_ok=True)
    daemon = Daemon(args.tierd, directory, pool_bytes=args.gpu_pool_bytes,
                    slab_bytes=256 << 20, host_cache_bytes=2 * model_bytes, extra_flags=flags)
    figures = {"flags": flags}
    try:
        with tierd.Client(daemon.socket) as client:
            for depth in args.prefetch_depth:
                streamed = tierd.transformers.from_pretrained(checkpoint, client, name=MODEL,
                                                              prefetch_depth=depth)
                if "host_compression" not in figures:
                    wait_in_host_cache(client)
                    if "--compress-weights=false" not in flags:
                        # The compressor leaves objects under 64 KiB (norms) alone, uncounted.
                        planned = sum(1 for info in client.list_objects(MODEL)
                                      if info.size >= 64 << 10)
                        figures["host_compression"] = wait_for_compression(client, planned)
                generate(streamed, ids, args.new_tokens)  # untimed
                # Each timed run's bytes: the daemon's copies during it, over its decode time.
                runs = []
                for _ in range(args.runs):
                    before = client.stats()
                    tokens, seconds = generate(streamed, ids, args.new_tokens)
                    after = client.stats()
                    runs.append((seconds, after.bytes_host_to_gpu - before.bytes_host_to_gpu,
                                 after.bytes_host_to_gpu_compressed -
                                 before.bytes_host_to_gpu_compressed,
                                 (after.decode_micros - before.decode_micros) / 1e6, tokens))
                streamed.tierd_weights.close()
                seconds, moved, compressed, decoding, tokens = min(runs, key=lambda run: run[0])
                rate = moved / seconds / 1e9
                figures[f"prefetch_depth_{depth}"] = {
                    "tokens_per_s": args.new_tokens / seconds, "bytes_host_to_gpu": moved,
                    "bytes_host_to_gpu_compressed": compressed,
                    "decode_seconds": decoding, "decode_share_of_time": decoding / seconds,
                    "streamed_gb_per_s": rate, "over_copy_rate": rate / copy_gb_per_s,
                    "same_tokens_as_resident": bool(torch.equal(tokens, expected))}
                crossed = compressed / max(moved, 1)
                log(f"{mode}, prefetch depth {depth}: {args.new_tokens / seconds:.1f} tok/s, "
                    f"{moved / args.new_tokens / 1e9:.2f} GB delivered a token at {rate:.1f} GB/s "
                    f"= {rate / copy_gb_per_s:.3f} of the copy rate ({crossed:.3f} of it crossed "
                    f"compressed; the GPU decoding {decoding / seconds:.1%} of the time); "
                    f"same tokens as resident: "
                    f"{figures[f'prefetch_depth_{depth}']['same_tokens_as_resident']}")
    finally:
        daemon.stop()
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, work_dir_required=True)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--gpu-pool-bytes", type=int, default=1 << 30)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--accelerate-tokens", type=int, default=4)
    parser.add_argument("--prefetch-depth", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--runs", type=int, default=2, help="timed runs; the fastest counts")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(1500, exit=True)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    checkpoint = os.path.join(args.work_dir, MODEL)
    os.makedirs(checkpoint)

    resident = build_checkpoint(args, checkpoint)
    model_bytes = sum(p.numel() * p.element_size() for p in resident.parameters())
    block_bytes = sum(p.numel() * p.element_size() for p in resident.model.layers[0].parameters())
    log(f"checkpoint: {args.layers} layers, {model_bytes / 1e9:.2f} GB, blocks of "
        f"{block_bytes / 2**20:.0f} MiB; GPU pool {args.gpu_pool_bytes / 2**30:.2f} GiB")
    ids = torch.randint(0, 32000, (1, args.prompt_tokens),
                        generator=torch.Generator().manual_seed(1)).cuda()
    results = {**results_header("llama_decode"), "transformers": transformers.__version__,
               "model_bytes": model_bytes, "block_bytes": block_bytes,
               "gpu_pool_bytes": args.gpu_pool_bytes, "new_tokens": args.new_tokens}

    expected, seconds = generate(resident, ids, args.new_tokens, runs=args.runs)
    results["resident"] = {"tokens_per_s": args.new_tokens / seconds}
    log(f"resident: {args.new_tokens / seconds:.1f} tok/s")
    results["copy_rate_gb_per_s"] = pinned_copy_rate(block_bytes)
    log(f"host -> GPU copy rate: {results['copy_rate_gb_per_s']:.1f} GB/s")

    for mode, flags in (("tierd", ["--compress-weights=false"]),
                        ("tierd_compressed", ["--compress-weights", "--compress-threads=8"]),
                        ("tierd_compressed_unchecked",
                         ["--compress-weights", "--compress-threads=8",
                          "--check-decodes-before-serving=false"])):
        results[mode] = stream_from_daemon(args, mode, flags, checkpoint, ids, expected,
                                           results["copy_rate_gb_per_s"])
    for depth in args.prefetch_depth:
        key = f"prefetch_depth_{depth}"
        for mode in ("tierd_compressed", "tierd_compressed_unchecked"):
            ratio = results[mode][key]["tokens_per_s"] / results["tierd"][key]["tokens_per_s"]
            results[mode][key]["over_raw_tokens_per_s"] = ratio
            results[mode][key]["goal_over_raw_at_least"] = 1.3
            log(f"prefetch depth {depth}: {mode} {ratio:.3f}x the raw daemon's tok/s "
                f"(goal >= 1.3)")

    try:
        import accelerate
    except ImportError:
        log("accelerate is not installed: no cpu_offload comparison")
    else:
        offloaded = accelerate.cpu_offload(resident.to("cpu"), execution_device="cuda:0")
        _, seconds = generate(offloaded, ids, args.accelerate_tokens)
        results["accelerate_cpu_offload"] = {"tokens_per_s": args.accelerate_tokens / seconds}
        log(f"accelerate.cpu_offload: {args.accelerate_tokens / seconds:.2f} tok/s")
    write_results(results, args.json)


if __name__ == "__main__":
    main()
