#!/usr/bin/env bash
# bench/run-load-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]
#
# From a bundle made by `deploy/bundle.sh --bench BUNDLE_DIR`: writes a model of random bytes under
# WORK_DIR (default /var/tmp/tierd-load-bench), starts one tierd (on cuda:0 where nvidia-smi sees a
# GPU, else on the host backend) and runs load_bench against it once per number of clients in
# CLIENTS, each run forking that many client processes. Each run writes OUT_DIR/load-<N>.json;
# OUT_DIR/load.json gathers them with the machine's description, OUT_DIR/summary.txt has one line
# per run, the log goes to OUT_DIR/bench.log and the daemon's to OUT_DIR/tierd.log.
#
# Environment (defaults for a GPU, then for the host backend):
#   CLIENTS          numbers of client processes, one run each ("1 4 8 16")
#   DURATION         seconds each run's workers run the mix (10)
#   TENSORS          the model, gpu_path_bench --tensors (16MiBx64 / 1MiBx32); its smallest
#                    object is pinned and fetched, the others prefetched
#   STORE_BYTES      bytes per store (16MiB / 1MiB)
#   HOLD             leases held at once in the batched step (100 / 32: each lease counts in
#                    full against the session's staging quota, the whole pool by default)
#   GPU_POOL_BYTES   the daemon's GPU staging pool (8GiB / 64MiB)
#   HOST_CACHE_BYTES the daemon's host cache (8GiB / 256MiB)
#   DEVICE           cuda:0 or host (auto)
#   TIERD_FLAGS      extra flags for the daemon; LOAD_FLAGS extra flags for load_bench
#   TIERD_NICE       the daemon's niceness (e.g. -10, as deploy/systemd sets it), else inherited
#   DAEMON_CPUS      CPUs the daemon may run on (taskset -c list, e.g. 0-3), else any
#   CLIENT_CPUS      CPUs the client processes may run on, else any
#   PYTHON           python3, to gather the results
set -uo pipefail
bundle=$(cd "${1:?usage: run-load-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]}" && pwd)
out=$(mkdir -p "${2:?OUT_DIR}" && cd "$2" && pwd)
work=${3:-/var/tmp/tierd-load-bench}
mkdir -p "$work"
work=$(cd "$work" && pwd)
exec > >(tee "$out/bench.log") 2>&1

if [[ -z ${DEVICE:-} ]]; then
  DEVICE=host
  nvidia-smi -L > /dev/null 2>&1 && DEVICE=cuda:0
fi
if [[ $DEVICE == host ]]; then
  tensors=${TENSORS:-1MiBx32}
  store_bytes=${STORE_BYTES:-1MiB}
  gpu_pool_bytes=${GPU_POOL_BYTES:-64MiB}
  host_cache_bytes=${HOST_CACHE_BYTES:-256MiB}
  hold=${HOLD:-32}
else
  tensors=${TENSORS:-16MiBx64}
  store_bytes=${STORE_BYTES:-16MiB}
  gpu_pool_bytes=${GPU_POOL_BYTES:-8GiB}
  host_cache_bytes=${HOST_CACHE_BYTES:-8GiB}
  hold=${HOLD:-100}
fi
clients=${CLIENTS:-1 4 8 16}
duration=${DURATION:-10}
python=${PYTHON:-python3}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "device: $DEVICE"
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  echo "gpu: ${gpu:-none}"
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); kernel $(uname -r)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
  echo "daemon: --gpu-pool-bytes=$gpu_pool_bytes --host-cache-bytes=$host_cache_bytes ${TIERD_FLAGS:-}${TIERD_NICE:+ (nice $TIERD_NICE)}${DAEMON_CPUS:+ (CPUs $DAEMON_CPUS)}"
  echo "clients: ${LOAD_FLAGS:-}${CLIENT_CPUS:+ (CPUs $CLIENT_CPUS)}"
  echo "model: $tensors; store bytes $store_bytes; hold $hold; $duration s per run"
} | tee "$out/environment.txt"

model=$work/model
stamp=$model/.tensors
if [[ "$(cat "$stamp" 2>/dev/null)" != "$tensors" ]]; then
  rm -rf "$model"
  "$bundle/bin/gpu_path_bench" --mode=make-model --model-dir="$model" --tensors="$tensors" || exit 1
  echo "$tensors" > "$stamp"
fi

socket=$work/tierd.sock
rm -rf "$work/state" "$socket"
${DAEMON_CPUS:+taskset -c "$DAEMON_CPUS"} ${TIERD_NICE:+nice -n "$TIERD_NICE"} "$bundle/bin/tierd" --device="$DEVICE" --socket="$socket" --state-dir="$work/state" \
  --host-cache-bytes="$host_cache_bytes" --gpu-pool-bytes="$gpu_pool_bytes" \
  ${TIERD_FLAGS:-} > "$out/tierd.log" 2>&1 &
tierd_pid=$!
trap 'kill -TERM $tierd_pid 2>/dev/null; wait $tierd_pid' EXIT
for _ in $(seq 300); do "$bundle/bin/tierctl" --socket="$socket" health >/dev/null 2>&1 && break; sleep 0.1; done
"$bundle/bin/tierctl" --socket="$socket" health || { cat "$out/tierd.log"; exit 1; }
# The host cache pins in the background; its threads would compete with the first run.
# (A small arena is pinned before the daemon serves: "... pinned so far" with nothing after.)
for _ in $(seq 1200); do grep -qE "fully pinned|pinned so far$" "$out/tierd.log" && break; sleep 0.1; done

status=0
jsons=()
for n in $clients; do
  echo "## $n clients"
  ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} "$bundle/bin/load_bench" --socket="$socket" --model=load --model-dir="$model" --clients="$n" \
    --duration="$duration" --hold="$hold" --store-bytes="$store_bytes" --daemon-pid="$tierd_pid" \
    --json="$out/load-$n.json" ${LOAD_FLAGS:-} || status=1
  [[ -s "$out/load-$n.json" ]] && jsons+=("$out/load-$n.json")
  kill -0 "$tierd_pid" 2>/dev/null || { echo "the daemon has died"; status=1; break; }
done
"$bundle/bin/tierctl" --socket="$socket" stats

"$python" - "$out" "${jsons[@]}" <<'PY' || status=1
import json, sys
out, paths = sys.argv[1], sys.argv[2:]
runs = [json.load(open(path)) for path in paths]
environment = dict(line.rstrip("\n").split(": ", 1) for line in open(f"{out}/environment.txt")
                   if ": " in line)
json.dump({"benchmark": "load", "environment": environment, "runs": runs},
          open(f"{out}/load.json", "w"), indent=2)
rows = ["clients  fetches/s  fetch p50 us  fetch p99 us  failures  daemon CPU s  daemon CPU us/fetch"]
for run in runs:
    fetch = run["operations"].get("fetch", {}).get("latency", {})
    failures = sum(kind["count"] for kind in run["failures"].values())
    cpu = run.get("daemon_cpu_s")
    per_fetch = run.get("daemon_cpu_us_per_fetch")
    rows.append(f"{run['clients']:7d}  {run['fetches_per_s']:9.0f}  {fetch.get('p50_us', 0):12.1f}  "
                f"{fetch.get('p99_us', 0):12.1f}  {failures:8d}  "
                f"{'-' if cpu is None else f'{cpu:12.2f}'}  "
                f"{'-' if per_fetch is None else f'{per_fetch:19.1f}'}")
open(f"{out}/summary.txt", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
exit $status
