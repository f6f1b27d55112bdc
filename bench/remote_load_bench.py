#!/usr/bin/env python3
"""Loads a model from an S3 bucket (a real Ceph RADOS Gateway that deploy/s3-gateway.sh starts on
this machine) and compares, in one run against the same gateway:

  aws_cp      `aws s3 cp --recursive` of the model's objects to local disk (Debian's awscli, its
              default 10 concurrent requests)
  boto3       boto3 ranged GETs of 8 MiB, N threads at once, into memory
  tierd       a daemon (host backend) registering the model from s3://BUCKET/PREFIX/ and
              prefetching every object into its host tier (--remote-streams=N, 8 MiB parts),
              timed from the registration to the last object resident; with the time until the
              first object was resident, to show the model is usable while it streams
  node        two daemons with --peers loading the model together: the bytes they fetch from the
              store, against the model's
  cache       a daemon restarted over its --remote-cache-dir: the bytes it fetches again

for N in --streams (1, 4, 16, 64). Reported: GB/s (10^9 bytes per second) of the model's bytes,
the median of --repeat runs, and tierd's ratio to the best reference at each N and overall.

The model is --files safetensors files of bf16 tensors drawn from N(0, 0.02^2), as transformers
initialises linear layers, --file-mib each. The gateway keeps objects in memory (memstore): about
1.5x the model, bounded by --gateway-memory-mib.

    /usr/bin/python3 bench/remote_load_bench.py --build build --json out.json

Loopback figures measure the gateway and the clients on this machine's cores, not a network: the
scaling with N is what carries over.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_harness import Daemon, log, results_header, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUCKET = "models"
PREFIX = "bench-model"
PART = 8 << 20


def write_model(directory, files, file_mib):
    """Writes `files` safetensors files of bf16 N(0, 0.02^2) tensors of 16 MiB; returns their
    paths and the bytes of their tensors."""
    import torch
    from dit_model import save_safetensors  # python/examples

    os.makedirs(directory, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    paths, tensor_bytes = [], 0
    per_file = max(1, file_mib // 16)
    for f in range(files):
        tensors = {}
        for t in range(per_file):
            tensor = torch.empty(2048, 4096, dtype=torch.float32)
            tensor.normal_(0.0, 0.02, generator=generator)
            tensors[f"layers.{f * per_file + t}.weight"] = tensor.to(torch.bfloat16)
            tensor_bytes += 2048 * 4096 * 2
        path = os.path.join(directory, f"model-{f + 1:05d}-of-{files:05d}.safetensors")
        save_safetensors(tensors, path)
        paths.append(path)
    return paths, tensor_bytes


class Gateway:
    def __init__(self, work, memory_mib):
        self.dir = os.path.join(work, "gateway")
        script = os.path.join(ROOT, "deploy", "s3-gateway.sh")
        subprocess.run(["bash", script, "start", self.dir, "--memory-mib", str(memory_mib)],
                       check=True, stdout=sys.stderr)
        self.script = script
        self.env = {}
        with open(os.path.join(self.dir, "s3.env")) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                self.env[key] = value
        self.endpoint = self.env["S3_ENDPOINT"]

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint,
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
                            region_name=self.env["AWS_REGION"],
                            config=Config(max_pool_connections=128, s3={"addressing_style": "path"},
                                          retries={"max_attempts": 5}))

    def stop(self):
        subprocess.run(["bash", self.script, "stop", self.dir], check=False, stdout=sys.stderr)


def aws_cp(gateway, destination):
    env = dict(os.environ, **{k: v for k, v in gateway.env.items() if k.startswith("AWS_")})
    shutil.rmtree(destination, ignore_errors=True)
    start = time.monotonic()
    subprocess.run(["/usr/bin/aws", "--endpoint-url", gateway.endpoint, "s3", "cp", "--recursive",
                    "--only-show-errors", f"s3://{BUCKET}/{PREFIX}/", destination],
                   check=True, env=env)
    seconds = time.monotonic() - start
    shutil.rmtree(destination, ignore_errors=True)
    return seconds


def boto3_ranged(client, objects, streams):
    """Reads every object with ranged GETs of PART bytes, `streams` at once, into memory."""
    buffers = {key: bytearray(size) for key, size in objects}
    ranges = [(key, offset, min(PART, size - offset))
              for key, size in objects for offset in range(0, size, PART)]

    def get(item):
        key, offset, length = item
        body = client.get_object(Bucket=BUCKET, Key=key,
                                 Range=f"bytes={offset}-{offset + length - 1}")["Body"].read()
        if len(body) != length:
            raise RuntimeError(f"{key}@{offset}: {len(body)} bytes, not {length}")
        buffers[key][offset:offset + length] = body

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=streams) as pool:
        for _ in pool.map(get, ranges):
            pass
    return time.monotonic() - start


class RemoteDaemon(Daemon):
    """tierd on the host backend, registering models from the gateway, with a fresh state
    directory and a client (`client`) of its own."""

    def __init__(self, build, work, gateway, name, host_cache_bytes, streams, extra=()):
        shutil.rmtree(os.path.join(work, f"state-{name}"), ignore_errors=True)
        credentials = os.path.join(work, "credentials")
        with open(credentials, "w") as f:
            f.write(f"[default]\naws_access_key_id = {gateway.env['AWS_ACCESS_KEY_ID']}\n"
                    f"aws_secret_access_key = {gateway.env['AWS_SECRET_ACCESS_KEY']}\n")
        os.chmod(credentials, 0o600)
        super().__init__(os.path.join(build, "bin", "tierd"), work, pool_bytes="64MiB",
                         slab_bytes="32MiB", host_cache_bytes=host_cache_bytes, device="host",
                         name=name, extra_flags=(
                             f"--s3-endpoint={gateway.endpoint}",
                             f"--s3-credentials-file={credentials}",
                             f"--remote-streams={streams}", "--remote-part-mib=8",
                             f"--model-roots=s3://{BUCKET}/", *extra))
        import tierd
        self.client = tierd.Client(self.socket, timeout=120)

    def stop(self):
        self.client.close()
        super().stop()


def tierd_load(daemon, model, poll_s=0.002):
    """Registers the model and prefetches every object into the host tier; returns (seconds to
    the last object resident, seconds to the first, seconds registering, the model's bytes), all
    from the registration's start."""
    start = time.monotonic()
    daemon.client.register_model(model, f"s3://{BUCKET}/{PREFIX}/", grouping="tensor")
    registered = time.monotonic() - start
    objects = daemon.client.list_objects(model)
    daemon.client.prefetch([o.key for o in objects], host_only=True)
    first = None
    while True:  # GetStats, every poll_s: one small unary call
        resident = daemon.client.stats().host.objects
        now = time.monotonic() - start
        if resident > 0 and first is None:
            first = now
        if resident == len(objects):
            return now, first, registered, sum(o.size for o in objects)
        if now > 600:
            raise RuntimeError(f"only {resident} of {len(objects)} objects resident after 600 s")
        time.sleep(poll_s)


def gbps(size, seconds):
    return size / seconds / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--file-mib", type=int, default=512)
    parser.add_argument("--streams", default="1,4,16,64")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--gateway-memory-mib", type=int, default=0,
                        help="0: 1.6x the model plus 512 MiB")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    sys.path.insert(0, os.path.join(args.build, "python"))
    sys.path.insert(0, os.path.join(ROOT, "python", "examples"))

    work = args.work_dir or tempfile.mkdtemp(prefix="remote-load-bench-")
    os.makedirs(work, exist_ok=True)
    model_bytes_est = args.files * args.file_mib << 20
    memory_mib = args.gateway_memory_mib or (model_bytes_est * 16 // 10 >> 20) + 512
    host_cache = f"{(model_bytes_est >> 20) + 256}MiB"
    gateway = None
    results = {**results_header("remote_load"), "cpus": os.cpu_count(), "runs": {}}
    try:
        log(f"writing {args.files} x {args.file_mib} MiB of bf16 tensors")
        paths, tensor_bytes = write_model(os.path.join(work, "model"), args.files, args.file_mib)
        log(f"starting the gateway ({memory_mib} MiB)")
        gateway = Gateway(work, memory_mib)
        s3 = gateway.client()
        s3.create_bucket(Bucket=BUCKET)
        for path in paths:
            s3.upload_file(path, BUCKET, f"{PREFIX}/{os.path.basename(path)}")
        objects = [(f"{PREFIX}/{os.path.basename(p)}", os.path.getsize(p)) for p in paths]
        file_bytes = sum(size for _, size in objects)
        shutil.rmtree(os.path.join(work, "model"))
        results.update(files=args.files, file_bytes=file_bytes, tensor_bytes=tensor_bytes)
        runs = results["runs"]

        def record(name, size, seconds, **extra):
            runs.setdefault(name, []).append(dict(seconds=seconds, gbps=gbps(size, seconds),
                                                  **extra))
            log(f"{name}: {gbps(size, seconds):.3f} GB/s ({seconds:.2f} s)"
                + "".join(f", {k} {v}" for k, v in extra.items()))

        for r in range(args.repeat):
            record("aws_cp", file_bytes, aws_cp(gateway, os.path.join(work, "aws-cp")))
            for n in streams:
                record(f"boto3_{n}", file_bytes, boto3_ranged(s3, objects, n))
            for n in streams:
                daemon = RemoteDaemon(args.build, work, gateway, "tierd", host_cache, n)
                try:
                    seconds, first, registered, size = tierd_load(daemon, f"m{r}")
                    stats = daemon.client.stats()
                finally:
                    daemon.stop()
                record(f"tierd_{n}", size, seconds, first_object_s=round(first, 3),
                       register_s=round(registered, 3), fetched_bytes=stats.remote_bytes_read,
                       object_bytes=size)

        # Two daemons of a node, each object fetched by its home only.
        sockets = [os.path.join(work, f"node{i}.sock") for i in range(2)]
        node = [RemoteDaemon(args.build, work, gateway, f"node{i}", host_cache, 16,
                       [f"--peers={','.join(sockets)}"]) for i in range(2)]
        try:
            start = time.monotonic()
            for daemon in node:
                daemon.client.register_model("m", f"s3://{BUCKET}/{PREFIX}/", grouping="tensor")
            keys = [o.key for o in node[0].client.list_objects("m")]
            for daemon in node:
                daemon.client.prefetch(keys, host_only=True)
            # Done when each daemon holds every object it is the home of.
            for daemon in node:
                while not all(o.in_host_cache for o in daemon.client.list_objects("m")
                              if o.home == daemon.socket):
                    if time.monotonic() - start > 600:
                        raise RuntimeError("the node's daemons did not load the model in 600 s")
                    time.sleep(0.01)
            seconds = time.monotonic() - start
            fetched = [d.client.stats().remote_bytes_read for d in node]
        finally:
            for daemon in node:
                daemon.stop()
        record("node_2_daemons", tensor_bytes, seconds, fetched_bytes=sum(fetched),
               per_daemon=fetched, fetched_per_model=round(sum(fetched) / tensor_bytes, 4))

        # A restarted daemon over its remote cache.
        cache = os.path.join(work, "remote-cache")
        shutil.rmtree(cache, ignore_errors=True)
        for attempt in ("cold", "restarted"):
            daemon = RemoteDaemon(args.build, work, gateway, "cached", host_cache, 16,
                            [f"--remote-cache-dir={cache}", f"--remote-cache-bytes={host_cache}"])
            try:  # a daemon of its own state each time: registered anew, loaded again
                seconds, first, registered, size = tierd_load(daemon, f"c-{attempt}")
                stats = daemon.client.stats()
            finally:
                daemon.stop()
            record(f"cache_{attempt}", size, seconds, fetched_bytes=stats.remote_bytes_read,
                   from_cache_bytes=stats.remote_cache_bytes_read)
        shutil.rmtree(cache, ignore_errors=True)
    finally:
        if gateway is not None:
            gateway.stop()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)

    summary = {}
    for name, entries in results["runs"].items():
        summary[name] = statistics.median(e["gbps"] for e in entries)
    results["median_gbps"] = summary
    best_reference = max(v for k, v in summary.items() if k == "aws_cp" or k.startswith("boto3_"))
    best_tierd = max(v for k, v in summary.items() if k.startswith("tierd_"))
    results["tierd_over_best_reference"] = round(best_tierd / best_reference, 3)
    results["per_streams"] = {
        n: {"tierd": summary[f"tierd_{n}"], "boto3": summary[f"boto3_{n}"],
            "ratio": round(summary[f"tierd_{n}"] / summary[f"boto3_{n}"], 3)} for n in streams}
    print(json.dumps(results, indent=2))
    write_results(results, args.json)


if __name__ == "__main__":
    main()
