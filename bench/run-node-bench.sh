#!/usr/bin/env bash
# bench/run-node-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]
#
# From a bundle made by `deploy/bundle.sh --bench BUNDLE_DIR`: runs node_bench, which starts
# DAEMONS tierd processes of one node itself (daemon i on GPU i % the GPUs in GPUS), writes a model
# of random bytes into MODEL_DIR (default WORK_DIR/model: put WORK_DIR on the disk models live on,
# or MODEL_DIR on /dev/shm for the host-memory path alone) and times, in one run, daemon 0 loading
# it alone, all daemons loading it together, and all fetching it from host memory at once against
# plain copies from one shared pinned buffer. Run it as root: the cold loads drop the page cache.
# Writes OUT_DIR/node.json (every figure), OUT_DIR/summary.txt (the table), OUT_DIR/bench.log,
# OUT_DIR/environment.txt, and each daemon's log per phase under WORK_DIR/daemon-I/.
#
# Environment (defaults):
#   DAEMONS           daemons of the node (the GPUs nvidia-smi lists, at least 2)
#   GPUS              CUDA ordinals the daemons are dealt over (all that nvidia-smi lists)
#   DEVICE            cuda, or host for a dry run without a GPU (cuda where nvidia-smi sees one)
#   TENSORS / FILES   the model (64MiBx128: 8 GiB, in 4 files; 1MiBx16 in 2 on the host backend)
#   MODEL_DIR         where the model goes (WORK_DIR/model); a directory holding another is refused
#   PHASES            node_bench --phases (alone,together,warm); alone,tp runs the tensor-parallel
#                     load: one rank per daemon, each cold-loading its shards (docs/SHARDS.md)
#   REPEAT            warm rounds (3)
#   COLD_REPEAT       runs of each cold phase, fresh daemons each time; the median is reported (1)
#   HOST_CACHE_BYTES / GPU_POOL_BYTES  each daemon's (the model's size and an eighth)
#   TIERD_FLAGS       more flags for every daemon; BENCH_FLAGS more flags for node_bench
set -uo pipefail
bundle=$(cd "${1:?usage: run-node-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]}" && pwd)
out=$(mkdir -p "${2:?OUT_DIR}" && cd "$2" && pwd)
work=${3:-/var/tmp/tierd-node-bench}
mkdir -p "$work"
work=$(cd "$work" && pwd)
exec > >(tee "$out/bench.log") 2>&1

gpus_seen=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | paste -sd, -)
if [[ -z ${DEVICE:-} ]]; then
  DEVICE=host
  [[ -n $gpus_seen ]] && DEVICE=cuda
fi
if [[ $DEVICE == host ]]; then
  tensors=${TENSORS:-1MiBx16}
  files=${FILES:-2}
  gpus=${GPUS:-0}
else
  tensors=${TENSORS:-64MiBx128}
  files=${FILES:-4}
  gpus=${GPUS:-$gpus_seen}
fi
gpu_count=$(tr ',' '\n' <<< "$gpus" | grep -c .)
daemons=${DAEMONS:-$((gpu_count < 2 ? 2 : gpu_count))}
model_dir=${MODEL_DIR:-$work/model}
mkdir -p "$(dirname "$model_dir")"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "device: $DEVICE; daemons: $daemons over GPUs $gpus"
  nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.max,pcie.link.width.max \
    --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); kernel $(uname -r)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
  echo "model: $tensors in $files files under $model_dir ($(df -hT "$(dirname "$model_dir")" | tail -n 1))"
  echo "daemons: ${HOST_CACHE_BYTES:+--host-cache-bytes=$HOST_CACHE_BYTES }${GPU_POOL_BYTES:+--gpu-pool-bytes=$GPU_POOL_BYTES }${TIERD_FLAGS:-}"
} | tee "$out/environment.txt"

flags=(--tierd="$bundle/bin/tierd" --daemons="$daemons" --gpus="$gpus" --backend="$DEVICE"
       --model-dir="$model_dir" --tensors="$tensors" --files="$files" --work-dir="$work"
       --repeat="${REPEAT:-3}" --cold-repeat="${COLD_REPEAT:-1}" --json="$out/node.json"
       --phases="${PHASES:-alone,together,warm}")
[[ -n ${HOST_CACHE_BYTES:-} ]] && flags+=(--host-cache-bytes="$HOST_CACHE_BYTES")
[[ -n ${GPU_POOL_BYTES:-} ]] && flags+=(--gpu-pool-bytes="$GPU_POOL_BYTES")
[[ -n ${TIERD_FLAGS:-} ]] && flags+=(--tierd-flags="$TIERD_FLAGS")
# shellcheck disable=SC2086  # BENCH_FLAGS is a list of flags
"$bundle/bin/node_bench" "${flags[@]}" ${BENCH_FLAGS:-} > "$out/summary.txt"
status=$?
cat "$out/summary.txt"
exit $status
