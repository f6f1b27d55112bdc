#!/usr/bin/env python3
"""Runs a DiT's block stack as a two-stage pipeline over two GPUs, handing each window's
activations from the first stage to the second through tierd, and checks the outputs against a
one-GPU run.

The first half of the blocks (with the embeddings) runs on GPU 0, the second half (with the head)
on GPU 1; the input is a sequence of windows (a video's frame windows, say). Window t's
activations are stored through GPU 0's daemon and fetched through GPU 1's, which copies them from
GPU 0's staging into its own (tierd --peers: peer to peer where the GPUs allow it, through pinned
host memory otherwise). Meanwhile GPU 0 already runs window t+1: both GPUs work at once.

    PYTHONPATH=build/python python3 python/examples/two_stage_pipeline.py \\
        --sockets /run/tierd/gpu0.sock,/run/tierd/gpu1.sock

Both daemons must name each other in --peers. Two daemons on one GPU run the same protocol (both
stages then share that GPU). On the host backend the stages run on the CPU.

Exit status: 0 when the outputs equal the one-GPU run's, 1 when they differ, 2 on bad arguments or
a tierd error.
"""

import argparse
import contextlib
import copy
import sys
import time

import torch

import tierd
from dit_model import DiT


def windows(count, tokens, in_dim, context_tokens, context_dim, device, seed=0):
    """The inputs: `count` windows of patch tokens sharing one text context and timestep."""
    generator = torch.Generator().manual_seed(seed)
    patches = [torch.randn(1, tokens, in_dim, generator=generator) for _ in range(count)]
    context = torch.randn(1, context_tokens, context_dim, generator=generator)
    timestep = torch.rand(1, generator=generator)
    return [p.to(device) for p in patches], context.to(device), timestep.to(device)


def stream_of(device):
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def on(stream):
    """`with on(stream):` runs torch work on `stream` (nothing to do on the CPU)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TwoStagePipeline:
    """The model's blocks split at `split`: stage 1 (embeddings, blocks[:split]) on session0's
    device, stage 2 (blocks[split:], head) on session1's. Activations go through tierd under
    `prefix`; two keys alternate, so a daemon holds at most two windows' activations.

    `session0` belongs to GPU 0's daemon, `session1` to GPU 1's; the daemons must be peers."""

    def __init__(self, model, split, session0, session1, prefix="pipeline/activations"):
        self.split = split
        self.session0 = session0
        self.session1 = session1
        self.device0 = session0.device
        self.device1 = session1.device
        self.stage1 = model.to(self.device0)
        self.stage2 = copy.deepcopy(model).to(self.device1)
        self.prefix = prefix
        self.stream0 = stream_of(self.device0)
        self.stream1 = stream_of(self.device1)

    def key(self, t):
        return f"{self.prefix}/{t % 2}"

    @torch.no_grad()
    def run(self, patches, context, timestep, overlap=True):
        """The outputs of every window, on the second device. With `overlap`, window t+1's first
        stage is queued on GPU 0 before window t is handed over and its second stage queued on
        GPU 1; without, each window goes through both stages before the next starts."""
        context = context.to(self.device0)
        timestep = timestep.to(self.device0)
        outputs = []
        if not overlap:
            for t, window in enumerate(patches):
                activations = self._first_stage(t, window, context, timestep)
                outputs.append(self._second_stage(t, activations))
                synchronize(self.device1)
            return outputs
        # The activations being stored stay referenced until their commit is answered: their copy
        # into staging has run by then.
        waiting = None
        for t, window in enumerate(patches):
            activations = self._first_stage(t, window, context, timestep)
            if waiting is not None:
                outputs.append(self._second_stage(*waiting))
            waiting = (t, activations)
        if waiting is not None:
            outputs.append(self._second_stage(*waiting))
        synchronize(self.device1)
        return outputs

    def _first_stage(self, t, patches, context, timestep):
        with on(self.stream0):
            x, ctx, time_embedding = self.stage1.embed(patches.to(self.device0), context, timestep)
            x = self.stage1.run_blocks(x, ctx, time_embedding, 0, self.split)
            activations = {"x": x, "context": ctx, "time": time_embedding}
        # Copied into GPU 0's staging on stream0, after the blocks; committed without waiting.
        self.session0.store_async(self.key(t), activations, spillable=False, stream=self.stream0)
        return activations

    def _second_stage(self, t, activations):  # the caller keeps `activations` alive until here
        # Window t is in GPU 0's daemon once its commit is answered (GPU 0 is running t+1 by
        # then); the fetch through GPU 1's daemon copies it over and makes stream1 wait for it.
        self.session0.wait_committed(self.key(t))
        lease = self.session1.fetch(self.key(t), stream=self.stream1)
        with on(self.stream1):
            x = self.stage2.run_blocks(lease.tensors["x"], lease.tensors["context"],
                                       lease.tensors["time"], self.split, len(self.stage2.blocks))
            out = self.stage2.unembed(x)
        lease.release(self.stream1)
        return out


def reference_outputs(model, patches, context, timestep, device):
    """The one-GPU run: every block of every window on `device`."""
    model = model.to(device)
    stream = stream_of(device)
    outputs = []
    with torch.no_grad(), on(stream):
        for window in patches:
            outputs.append(model(window.to(device), context.to(device), timestep.to(device)))
    synchronize(device)
    return outputs


def compare(expected, actual):
    """(equal, largest absolute difference) of two lists of outputs."""
    worst = 0.0
    equal = len(expected) == len(actual)
    for e, a in zip(expected, actual):
        a = a.to(e.device)
        if not torch.equal(e, a):
            equal = False
            worst = max(worst, (e.float() - a.float()).abs().max().item())
    return equal, worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sockets", default="/run/tierd/gpu0.sock,/run/tierd/gpu1.sock",
                        help="GPU 0's and GPU 1's daemon sockets, comma-separated")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--ffn-dim", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024, help="patch tokens per window")
    parser.add_argument("--windows", type=int, default=8)
    args = parser.parse_args()
    sockets = args.sockets.split(",")
    if len(sockets) != 2:
        parser.error("--sockets takes two sockets: GPU 0's daemon's and GPU 1's")
    if args.blocks < 2:
        parser.error("--blocks must be at least 2 (one per stage)")

    try:
        clients = [tierd.Client(socket, client_name="two_stage_pipeline example")
                   for socket in sockets]
        sessions = []
        for client in clients:
            client.wait_until_ready(timeout=10)
            sessions.append(client.session())
    except tierd.TierdError as error:
        print(f"two_stage_pipeline: {error}", file=sys.stderr)
        return 2
    print(f"two_stage_pipeline: stage 1 on {sessions[0].info.device} ({sessions[0].device}), "
          f"stage 2 on {sessions[1].info.device} ({sessions[1].device})")

    torch.manual_seed(0)
    model = DiT(blocks=args.blocks, dim=args.dim, ffn_dim=args.ffn_dim, heads=args.heads).eval()
    patches, context, timestep = windows(args.windows, args.tokens, 16, 64, 32, torch.device("cpu"))
    started = time.perf_counter()
    expected = reference_outputs(copy.deepcopy(model), patches, context, timestep,
                                 sessions[0].device)
    one_gpu_s = time.perf_counter() - started

    pipeline = TwoStagePipeline(model, args.blocks // 2, sessions[0], sessions[1])
    try:
        started = time.perf_counter()
        outputs = pipeline.run(patches, context, timestep, overlap=True)
        pipeline_s = time.perf_counter() - started
        handed_over = clients[1].stats().peer_fetches
    except tierd.TierdError as error:
        print(f"two_stage_pipeline: {error}", file=sys.stderr)
        return 2
    finally:
        for session in sessions:
            session.close()
        for client in clients:
            client.close()
    equal, worst = compare(expected, outputs)
    print(f"two_stage_pipeline: {args.windows} windows of {args.tokens} tokens through "
          f"{args.blocks} blocks: one GPU {one_gpu_s * 1e3:.1f} ms (first run, includes warm-up), "
          f"pipeline {pipeline_s * 1e3:.1f} ms; {handed_over} handoffs so far through "
          f"{sockets[1]}")
    if not equal:
        print(f"two_stage_pipeline: outputs DIFFER from the one-GPU run (largest difference "
              f"{worst:g})", file=sys.stderr)
        return 1
    print("two_stage_pipeline: outputs equal the one-GPU run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
