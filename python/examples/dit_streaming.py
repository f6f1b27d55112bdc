#!/usr/bin/env python3
"""Streams a DiT-like model's blocks from tierd and checks the output against the all-resident run.

Saves a randomly initialised model as safetensors, registers it with the daemon, runs it once with
all weights in place (the reference) and once as a module whose blocks are streamed by
tierd.torch.stream_weights, and compares the outputs. Works on either backend: CUDA tensors when the
daemon runs on a GPU, CPU tensors on the host backend.

    PYTHONPATH=build/python python3 python/examples/dit_streaming.py \
        --socket /run/tierd/gpu0.sock --model-dir /var/lib/tierd/models/dit-example

Exit status: 0 when the outputs are equal, 1 when they differ, 2 on bad arguments or a tierd error.
"""

import argparse
import os
import sys
import time

import torch

import tierd
import tierd.torch
from dit_model import DiT, save_safetensors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default="/run/tierd/gpu0.sock", help="the daemon's socket")
    parser.add_argument("--model-dir", required=True,
                        help="directory to save the model in; the daemon must be able to read it")
    parser.add_argument("--name", default="dit-example", help="name to register the model under")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--ffn-dim", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="forward passes (denoising steps)")
    parser.add_argument("--granularity", choices=["block", "phase"], default="block")
    parser.add_argument("--prefetch-depth", type=int, default=2)
    parser.add_argument("--resident-blocks", type=int, default=0)
    args = parser.parse_args()

    client = tierd.Client(args.socket, client_name="dit_streaming example")
    try:
        client.wait_until_ready(timeout=10)
        session = client.session()
    except tierd.TierdError as error:
        print(f"dit_streaming: {error}", file=sys.stderr)
        return 2
    device = session.device
    print(f"dit_streaming: daemon {session.info.device}, tensors on {device}, "
          f"session over {session.transport}")
    config = dict(blocks=args.blocks, dim=args.dim, ffn_dim=args.ffn_dim, heads=args.heads)

    torch.manual_seed(0)
    reference = DiT(**config).to(device).eval()
    os.makedirs(args.model_dir, exist_ok=True)
    path = os.path.join(args.model_dir, "model.safetensors")
    save_safetensors(reference.state_dict(), path)
    if any(model.name == args.name for model in client.list_models()):
        client.drop_model(args.name)
    summary = client.register_model(args.name, args.model_dir, grouping=args.granularity)
    print(f"dit_streaming: saved {path} and registered {args.name}: {summary.objects} objects, "
          f"{summary.total_bytes / 2**20:.1f} MiB")

    generator = torch.Generator().manual_seed(1)
    inputs = [(torch.randn(1, args.tokens, 16, generator=generator).to(device),
               torch.randn(1, 64, 32, generator=generator).to(device),
               torch.full((1,), 1.0 - step / args.steps).to(device)) for step in range(args.steps)]

    def run(module):
        started = time.perf_counter()
        with torch.no_grad():
            outputs = [module(*step) for step in inputs]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return outputs, time.perf_counter() - started

    expected, resident_seconds = run(reference)
    del reference
    torch.manual_seed(1234)  # other weights: whatever the streamed run computes came from tierd
    streamed_module = DiT(**config).to(device).eval()
    try:
        with tierd.torch.stream_weights(streamed_module, session, args.name,
                                        granularity=args.granularity,
                                        prefetch_depth=args.prefetch_depth,
                                        resident_blocks=args.resident_blocks) as streamed:
            outputs, streamed_seconds = run(streamed_module)
            print(f"dit_streaming: streamed {len(streamed.streamed_units)} units, "
                  f"{len(streamed.resident_units)} resident, {streamed.fetches} fetches")
    except tierd.TierdError as error:
        print(f"dit_streaming: {error}", file=sys.stderr)
        return 2
    finally:
        session.close()
        client.close()

    equal = all(torch.equal(got, want) for got, want in zip(outputs, expected))
    print(f"dit_streaming: all resident {resident_seconds * 1e3:.1f} ms, streamed "
          f"{streamed_seconds * 1e3:.1f} ms for {args.steps} steps; outputs "
          f"{'equal' if equal else 'DIFFER'}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
