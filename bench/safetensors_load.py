#!/usr/bin/env python3
"""Times safetensors.torch.load_file(path, device="cuda") over FILES, one after another.

Prints the throughput in GB/s (bytes of the files / seconds until the tensors are on the GPU), for
gpu_path_bench --mode=cold. Exits 2 when torch or safetensors is missing.
"""
import os
import sys
import time


def main(files):
    try:
        import torch
        from safetensors.torch import load_file
    except ImportError as error:
        print(f"safetensors_load: {error}", file=sys.stderr)
        return 2
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the CUDA context is not part of the load
    total = sum(os.path.getsize(path) for path in files)
    start = time.perf_counter()
    loaded = [load_file(path, device="cuda") for path in files]
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del loaded
    print(f"{total / seconds / 1e9:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
