#!/usr/bin/env python3
"""A tensor-parallel forward with one rank per GPU, each rank served by the daemon of its own GPU,
on a machine with several GPUs (the tests run the ranks on one GPU's daemon).

Starts one tierd per GPU (cuda:0 .. cuda:N-1, peers of each other, so the node's host tier reads
each shard once), saves the Llama-architecture layer of python/tests/tp_layers.py as
safetensors, registers it with every daemon, and runs N rank processes: rank r loads its shards
from daemon r with tierd.tensor_parallel.load_shards and computes the layer's forward, the partial
results all-reduced over gloo. Rank 0's output must equal the whole layer's forward on the CPU.
Prints and writes (--json) the ranks' devices, each parameter's shard key and shape, the largest
difference and the daemons' disk bytes.

    PYTHONPATH=BUNDLE/python:BUNDLE/python/examples:BUNDLE/python/tests \\
        bench/tp_forward_check.py --tierd BUNDLE/bin/tierd --work-dir WORK [--ranks 2] [--json F]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

import torch

# The harness first: it puts the examples' models on the path.
from bench_harness import Daemon, add_common_arguments, results_header, write_results  # noqa: E402
import tierd  # noqa: E402
from dit_model import save_safetensors  # noqa: E402
from tp_layers import PREFIX, RANK_SOURCE, example_input, reference_layer

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, work_dir_required=True)
    parser.add_argument("--ranks", type=int, default=torch.cuda.device_count())
    args = parser.parse_args()
    if args.ranks < 2 or args.ranks > torch.cuda.device_count():
        sys.exit(f"--ranks must be 2 to the {torch.cuda.device_count()} GPUs seen")
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    sockets = [os.path.join(args.work_dir, f"gpu{rank}.sock") for rank in range(args.ranks)]
    daemons = []
    try:
        for rank in range(args.ranks):
            peers = ",".join(socket for other, socket in enumerate(sockets) if other != rank)
            daemons.append(Daemon(args.tierd, args.work_dir, pool_bytes="512MiB",
                                  slab_bytes="512MiB", host_cache_bytes="1GiB",
                                  device=f"cuda:{rank}", name=f"gpu{rank}",
                                  extra_flags=(f"--peers={peers}",)))
        reference = reference_layer()
        model_dir = os.path.join(args.work_dir, "llama")
        os.makedirs(model_dir)
        save_safetensors({PREFIX + name: tensor for name, tensor in reference.state_dict().items()},
                         os.path.join(model_dir, "model.safetensors"))
        for socket in sockets:
            with tierd.Client(socket) as client:
                client.register_model("llama", model_dir, grouping="tensor")
        out = os.path.join(args.work_dir, "y.pt")
        rendezvous = os.path.join(args.work_dir, "rendezvous")
        processes = [subprocess.Popen([sys.executable, "-c", RANK_SOURCE, sockets[rank], str(rank),
                                       str(args.ranks), rendezvous, out], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
                     for rank in range(args.ranks)]
        reports = []
        for process in processes:
            stdout, stderr = process.communicate(timeout=300)
            if process.returncode != 0:
                sys.exit(f"a rank failed:\n{stderr}")
            reports.append(json.loads(stdout.strip().splitlines()[-1]))
        with torch.no_grad():
            expected = reference(example_input())
        got = torch.load(out)
        difference = float((got - expected).abs().max())
        equal = torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
        disk = []
        for socket in sockets:
            with tierd.Client(socket) as client:
                disk.append(client.stats().bytes_disk_to_host)
        result = {**results_header("tp_forward_check"), "ranks": reports,
                  "max_difference": difference, "equal_within_1e-5": equal,
                  "gpus": [torch.cuda.get_device_name(rank) for rank in range(args.ranks)],
                  "disk_to_host_bytes_per_daemon": disk,
                  "model_bytes": sum(t.numel() * t.element_size()
                                     for t in reference.state_dict().values())}
        print(json.dumps(result, indent=2))
        write_results(result, args.json)
        if not equal:
            sys.exit("the ranks' all-reduced output differs from the whole layer's")
    finally:
        for daemon in daemons:
            daemon.stop()


if __name__ == "__main__":
    main()
