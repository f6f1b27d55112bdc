#!/usr/bin/env python3
"""A diffusion pipeline's restart: from a new process's imports to its first denoising step, with
a text encoder (24 layers of 4096, UMT5-XXL's depth and width), a DiT of Wan-14B's shape (40 blocks
of 5120, FFN 13824) and a latent decoder of a VAE's size, all bf16 (about 36 GB; the models of
python/examples/dit_model.py), each way in a process of its own, in the same run, on the same GPU:

  cold       every component's safetensors read to the GPU (safetensors.torch.load_file straight
             to the device, the files in the page cache) and assigned to modules built on the meta
             device: what a pipeline without tierd does at its fastest
  first      the same through tierd, the first time: registered, read from the files by the daemon,
             mapped (tierd.torch.map_weights) and retained on the daemon's GPU
  retained   a later process: the retained components mapped, no byte moved

Each process is timed from after its imports and its CUDA context to its first denoising step's
output (the prompt encoded, one pass of the DiT over the video tokens); the decoder is loaded, not
run. The outputs of every way must be equal. The goal of retained against cold is 10x
(docs/BENCHMARKS.md).

    bench/dit_restart_bench.py --tierd BUNDLE/bin/tierd --work-dir /dev/shm/dr --json out.json
"""

import argparse
import json
import os
import subprocess
import sys

import torch

from bench_harness import Daemon, add_common_arguments, log, results_header, write_results

# The components: (model name, class in dit_model, its settings).
COMPONENTS = {
    "text-encoder": ("TextEncoder", dict(layers=24, dim=4096, ffn_dim=10240, heads=32,
                                         vocab=32000, context_dim=4096)),
    "dit": ("DiT", dict(blocks=40, dim=5120, ffn_dim=13824, heads=40, in_dim=16,
                        context_dim=4096)),
    "decoder": ("LatentDecoder", dict(stages=4, channels=768, in_dim=16)),
}

# One measured process: argv[1] is its settings as JSON; it prints one JSON line.
CHILD = r"""
import json, sys, time
settings = json.loads(sys.argv[1])
import torch, safetensors.torch, tierd, tierd.torch, dit_model
torch.zeros(1, device="cuda")  # the CUDA context, as a server has before it loads weights
# torch imports what the meta device's context needs on its first use: a server has it imported
# before it loads weights, so each component is built once small first.
_small = {"layers": 1, "blocks": 1, "stages": 1, "dim": 64, "ffn_dim": 128, "heads": 4,
          "vocab": 64, "context_dim": 64, "channels": 32}
with torch.device("meta"):
    for kind, config in settings["components"].values():
        getattr(dit_model, kind)(**{key: _small.get(key, value) for key, value in config.items()})
start = time.perf_counter()
modules = {}
for name, (kind, config) in settings["components"].items():
    with torch.device("meta"):
        modules[name] = getattr(dit_model, kind)(**config).to(torch.bfloat16).eval()
built = time.perf_counter()
client = weights = None
phases = {}  # where the weights' time went, in seconds from `built`
def mark(phase):
    phases[phase] = time.perf_counter() - built
if settings["way"] == "cold":
    for name, module in modules.items():
        state = safetensors.torch.load_file(settings["files"][name], device="cuda")
        mark(f"{name} read")
        module.load_state_dict(state, assign=True)
        mark(f"{name} assigned")
else:
    client = tierd.Client(settings["socket"])
    session = client.session()
    mark("connected")
    weights = []
    for name, module in modules.items():
        if settings["way"] == "first":
            client.register_model(name, settings["directories"][name], grouping="block")
            mark(f"{name} registered")
        session.retain(name)  # answers once the component is on the GPU
        mark(f"{name} retained")
        weights.append(tierd.torch.map_weights(module, session, name))
        mark(f"{name} mapped")
loaded = time.perf_counter()
generator = torch.Generator().manual_seed(1)
ids = torch.randint(0, settings["vocab"], (1, settings["text_tokens"]), generator=generator)
patches = torch.randn(1, settings["video_tokens"], 16, generator=generator)
with torch.no_grad():
    context = modules["text-encoder"](ids.cuda())
    output = modules["dit"](patches.cuda().to(torch.bfloat16), context,
                            torch.ones(1, device="cuda", dtype=torch.bfloat16))
torch.cuda.synchronize()
seconds = time.perf_counter() - start
result = {"seconds": seconds, "weights_seconds": loaded - start, "build_seconds": built - start,
          "step_seconds": time.perf_counter() - loaded, "phases": phases,
          "bytes": sum(p.numel() * p.element_size() for m in modules.values()
                       for p in m.parameters())}
if settings.get("save_output"):
    torch.save(output.float().cpu(), settings["save_output"])
if settings.get("reference"):
    result["output_equal"] = bool(torch.equal(output.float().cpu(),
                                              torch.load(settings["reference"])))
print(json.dumps(result), flush=True)
for mapped in weights or []:
    mapped.close()
if client is not None:
    session.close()
    client.close()
"""


def run_child(settings):
    process = subprocess.run([sys.executable, "-c", CHILD, json.dumps(settings)],
                             stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    if process.returncode != 0 or not process.stdout.strip():
        sys.exit(f"the {settings['way']} process failed (exit {process.returncode})")
    return json.loads(process.stdout.strip().splitlines()[-1])


def build_components(work_dir):
    """Writes each component, its weights random, to WORK/NAME/model.safetensors; returns the
    files and directories."""
    import dit_model
    files, directories = {}, {}
    torch.manual_seed(0)
    for name, (kind, config) in COMPONENTS.items():
        with torch.device("cuda"):
            module = getattr(dit_model, kind)(**config).to(torch.bfloat16)
        directories[name] = os.path.join(work_dir, name)
        os.makedirs(directories[name], exist_ok=True)
        files[name] = os.path.join(directories[name], "model.safetensors")
        dit_model.save_safetensors(module.state_dict(), files[name])
        log(f"{name}: {os.path.getsize(files[name]) / 1e9:.2f} GB")
        del module
        torch.cuda.empty_cache()
    return files, directories


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, work_dir_required=True)
    parser.add_argument("--video-tokens", type=int, default=4096)
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--pool-gib", type=int, default=44)
    parser.add_argument("--host-cache-gib", type=int, default=40)
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    results = results_header("dit_restart")
    log("writing the components")
    files, directories = build_components(args.work_dir)
    reference = os.path.join(args.work_dir, "step.pt")
    base = {"components": {name: [kind, config] for name, (kind, config) in COMPONENTS.items()},
            "files": files, "directories": directories, "video_tokens": args.video_tokens,
            "text_tokens": args.text_tokens, "vocab": COMPONENTS["text-encoder"][1]["vocab"]}
    runs = {}
    # The page cache warmed by the first, whose output is the reference.
    runs["cold_first"] = run_child(dict(base, way="cold", save_output=reference))
    runs["cold"] = run_child(dict(base, way="cold", reference=reference))
    log(f"cold: {runs['cold']['seconds']:.2f} s ({runs['cold']['weights_seconds']:.2f} s "
        f"weights, {runs['cold']['step_seconds']:.2f} s step)")
    flags = [f"--retain-bytes={args.pool_gib - 2}GiB", "--compress-weights=false"]
    with Daemon(args.tierd, args.work_dir, pool_bytes=f"{args.pool_gib}GiB", slab_bytes="4GiB",
                host_cache_bytes=f"{args.host_cache_gib}GiB", extra_flags=flags) as daemon:
        tierd_way = dict(base, socket=daemon.socket, reference=reference)
        runs["first"] = run_child(dict(tierd_way, way="first"))
        log(f"first through tierd: {runs['first']['seconds']:.2f} s")
        runs["retained"] = run_child(dict(tierd_way, way="retained"))
        runs["retained_again"] = run_child(dict(tierd_way, way="retained"))
        log(f"retained: {runs['retained']['seconds']:.3f} s "
            f"({runs['retained']['weights_seconds']:.3f} s weights), "
            f"again {runs['retained_again']['seconds']:.3f} s")
    results["runs"] = runs
    results["model_bytes"] = runs["cold"]["bytes"]
    results["outputs_equal"] = all(run.get("output_equal", True) for run in runs.values())
    results["cold_over_retained"] = runs["cold"]["seconds"] / runs["retained"]["seconds"]
    results["cold_over_retained_weights"] = (runs["cold"]["weights_seconds"]
                                             / runs["retained"]["weights_seconds"])
    results["goal_cold_over_retained"] = 10
    log(f"cold / retained: {results['cold_over_retained']:.1f}x to the first step, "
        f"{results['cold_over_retained_weights']:.1f}x for the weights; outputs equal: "
        f"{results['outputs_equal']}")
    write_results(results, args.json)


if __name__ == "__main__":
    main()
