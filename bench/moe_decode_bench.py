#!/usr/bin/env python3
"""Greedy decoding at batch 1 with a Qwen3-MoE-like checkpoint (random weights, bf16) whose experts
do not fit the daemon's GPU pool, served by tierd.transformers.from_pretrained three ways and
compared in the same run, on the same GPU:

  resident            the model all on the GPU (the reference tokens; tok/s)
  stream              experts="stream": every block streamed whole, experts included
  on_demand           experts="on_demand": only the experts each layer's router chose, the next
                      layer's guessed from the previous token (prefetch), dense blocks resident
  on_demand_no_prefetch  the same without the guess
  accelerate          accelerate.cpu_offload of the same weights (when accelerate is installed)

Reported for each: tokens/s and whether the tokens equal the resident model's; for tierd, the
bytes the daemon copied host -> GPU per token; on demand, the experts fetched per token, the share
found in the GPU pool (the expert cache's hit rate), the prefetch's used and wasted guesses, and
the bytes moved per token over what the chosen experts not found in the pool weigh (goal <= 1.2).
Goal: on demand >= 3x the tokens/s of whole-block streaming.

Each is run greedy and sampled (temperature 1, seeded alike: equal logits give equal tokens); with
random weights greedy decoding soon repeats itself, and so do its experts, while sampling chooses
varied tokens and experts. Before each timed run the same tokens are decoded once untimed (the
daemon's host cache then holds what the run reads, as on a serving node), and the GPU pool is
emptied of the model's objects, so the run's pool hits are its own.

    bench/moe_decode_bench.py --tierd BUNDLE/bin/tierd --work-dir WORK --json out.json
"""

import argparse
import faulthandler
import os
import shutil

import torch
import transformers

import tierd
import tierd.transformers
from bench_harness import (Daemon, add_common_arguments, generate, log, results_header,
                           write_results)


def build_checkpoint(args, directory):
    """A seeded random Qwen3-MoE of --layers layers saved as transformers saves it (one tensor per
    expert); returns the model, on the GPU."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
        moe_intermediate_size=args.moe_intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 128, num_key_value_heads=4, head_dim=128,
        num_experts=args.experts, num_experts_per_tok=args.top_k, max_position_embeddings=4096,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory, max_shard_size="2GB")
    return model.eval()


def run_tierd(client, checkpoint, ids, expected, tokens, expert_bytes, sampled, **options):
    """Loads the checkpoint through tierd with `options`, decodes `tokens` once untimed, empties
    the GPU pool of the model's objects and decodes them again, timed."""
    model = tierd.transformers.from_pretrained(checkpoint, client, **options)
    name = model.tierd_weights.model
    try:
        # Untimed: the host cache then holds what the timed run reads.
        generate(model, ids, tokens, sampled=sampled)
        session = model.tierd_weights.session
        session.evict(f"{name}/", tier="gpu")
        experts = getattr(model, "tierd_experts", None)
        counters = (experts.fetched, experts.resident, experts.prefetched, experts.wasted) \
            if experts else None
        before = client.stats().bytes_host_to_gpu
        out, seconds = generate(model, ids, tokens, sampled=sampled)
        moved = client.stats().bytes_host_to_gpu - before
    finally:
        model.tierd_weights.close()
    figures = {"tokens": tokens, "tokens_per_s": tokens / seconds,
               "bytes_host_to_gpu_per_token": moved / tokens,
               "same_tokens_as_resident": bool(torch.equal(out, expected[:, :tokens]))}
    if experts:
        fetched, resident, prefetched, wasted = (now - then for now, then in zip(
            (experts.fetched, experts.resident, experts.prefetched, experts.wasted), counters))
        chosen_not_cached = (fetched - resident) * expert_bytes
        figures.update({
            "experts_fetched_per_token": fetched / tokens,
            "expert_cache_hit_rate": resident / fetched if fetched else None,
            "prefetch_used": prefetched, "prefetch_wasted": wasted,
            "chosen_expert_bytes_per_token": fetched * expert_bytes / tokens,
            "chosen_uncached_expert_bytes_per_token": chosen_not_cached / tokens,
            "moved_over_chosen_uncached": moved / chosen_not_cached if chosen_not_cached else None,
            "goal_moved_over_chosen_uncached_at_most": 1.2})
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, work_dir_required=True)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--moe-intermediate", type=int, default=1024)
    parser.add_argument("--gpu-pool-bytes", type=int, default=3 << 30)
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--stream-tokens", type=int, default=16,
                        help="tokens for whole-block streaming (slow: every token moves all)")
    parser.add_argument("--accelerate-tokens", type=int, default=4)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(1200, exit=True)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    checkpoint = os.path.join(args.work_dir, "moe")
    os.makedirs(checkpoint)

    resident = build_checkpoint(args, checkpoint)
    model_bytes = sum(p.numel() * p.element_size() for p in resident.parameters())
    expert_bytes = 3 * args.hidden * args.moe_intermediate * 2
    experts_total = expert_bytes * args.experts * args.layers
    log(f"checkpoint: {args.layers} layers of {args.experts} experts (top {args.top_k}), "
        f"{model_bytes / 2**30:.2f} GiB of which experts {experts_total / 2**30:.2f} GiB; "
        f"GPU pool {args.gpu_pool_bytes / 2**30:.2f} GiB")
    ids = torch.randint(3, 32000, (1, args.prompt_tokens),
                        generator=torch.Generator().manual_seed(1)).cuda()
    results = {**results_header("moe_decode"), "transformers": transformers.__version__,
               "model_bytes": model_bytes, "expert_bytes_total": experts_total,
               "expert_bytes": expert_bytes, "gpu_pool_bytes": args.gpu_pool_bytes,
               "layers": args.layers, "experts": args.experts, "top_k": args.top_k}

    expected = {}
    for decoding in ("greedy", "sampled"):
        sampled = decoding == "sampled"
        generate(resident, ids, args.new_tokens, sampled=sampled)  # untimed, as the tierd runs
        expected[decoding], seconds = generate(resident, ids, args.new_tokens, sampled=sampled)
        results.setdefault(decoding, {})["resident"] = {
            "tokens": args.new_tokens, "tokens_per_s": args.new_tokens / seconds,
            "distinct_tokens": len(set(expected[decoding][0].tolist()))}
        log(f"resident, {decoding}: {args.new_tokens / seconds:.1f} tok/s, "
            f"{results[decoding]['resident']['distinct_tokens']} distinct tokens")

    daemon = Daemon(args.tierd, args.work_dir, pool_bytes=args.gpu_pool_bytes,
                    slab_bytes=1 << 30, host_cache_bytes=int(2.2 * model_bytes))
    try:
        with tierd.Client(daemon.socket) as client:
            runs = {
                "stream": dict(tokens=args.stream_tokens, experts="stream", prefetch_depth=1),
                "on_demand": dict(tokens=args.new_tokens, experts="on_demand",
                                  resident_blocks=args.layers, expert_prefetch=True),
                "on_demand_no_prefetch": dict(tokens=args.new_tokens, experts="on_demand",
                                              resident_blocks=args.layers, expert_prefetch=False),
            }
            for decoding in ("greedy", "sampled"):
                for mode, options in runs.items():
                    options = dict(options)
                    tokens = options.pop("tokens")
                    figures = run_tierd(client, checkpoint, ids, expected[decoding], tokens,
                                        expert_bytes, decoding == "sampled", **options)
                    results[decoding][mode] = figures
                    log(f"{decoding}, {mode}: " + ", ".join(
                        f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in figures.items()))
                figures = results[decoding]
                figures["on_demand_over_stream"] = (figures["on_demand"]["tokens_per_s"] /
                                                    figures["stream"]["tokens_per_s"])
                log(f"{decoding}: on demand / whole-block streaming: "
                    f"{figures['on_demand_over_stream']:.2f}x (goal >= 3)")
    finally:
        daemon.stop()
    results["goal_on_demand_over_stream_at_least"] = 3.0

    try:
        import accelerate
    except ImportError:
        log("accelerate is not installed: no cpu_offload comparison")
    else:
        offloaded = accelerate.cpu_offload(resident.to("cpu"), execution_device="cuda:0")
        out, seconds = generate(offloaded, ids, args.accelerate_tokens)
        results["greedy"]["accelerate_cpu_offload"] = {
            "tokens": args.accelerate_tokens, "tokens_per_s": args.accelerate_tokens / seconds,
            "same_tokens_as_resident": bool(torch.equal(
                out.cpu(), expected["greedy"][:, :args.accelerate_tokens].cpu()))}
        log(f"accelerate.cpu_offload: {args.accelerate_tokens / seconds:.2f} tok/s")
    write_results(results, args.json)


if __name__ == "__main__":
    main()
