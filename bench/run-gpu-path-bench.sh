#!/usr/bin/env bash
# bench/run-gpu-path-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]
#
# On the GPU machine, from a bundle made by `deploy/bundle.sh --bench BUNDLE_DIR`: writes two
# models of random bytes under WORK_DIR (default /var/tmp/tierd-bench; put it on the disk models
# live on, not tmpfs), starts tierd on cuda:0, and runs gpu_path_bench's four modes against it:
# warm fetch, fetch latency, prefetch+store both directions, then the cold load (which drops the
# page cache: run as root). Each mode writes OUT_DIR/<mode>.json; the log goes to OUT_DIR/bench.log
# and the machine's description to OUT_DIR/environment.txt.
#
# Environment: REPEAT (runs per side, default 5), WARM_TENSORS / COLD_TENSORS (gpu_path_bench
# --tensors lists), WEIGHTS (the tensors' values: random, the default; normal: bf16 with a
# checkpoint's statistics; e4m3: those quantised to FP8 with block scales), PYTHON (with torch and safetensors, default python3), TIERD_FLAGS
# (extra flags for the daemon), BENCH_FLAGS (extra flags for gpu_path_bench), FIO (the cold mode's
# fio, default the bundle's; empty: no fio reference, for models on tmpfs), SAFETENSORS_SCRIPT
# (the cold mode's safetensors reference, default bench/safetensors_load.py; empty: none), MODES (default
# "warm latency duplex cold"), DEVICE (default cuda:0; "host" makes a dry run of the script on a
# machine without a GPU). Compressed weights: WEIGHTS=normal TIERD_FLAGS="--compress-weights
# --compress-threads=8" BENCH_FLAGS=--compressed.
set -uo pipefail
bundle=$(cd "${1:?usage: run-gpu-path-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]}" && pwd)
out=$(mkdir -p "${2:?OUT_DIR}" && cd "$2" && pwd)
work=${3:-/var/tmp/tierd-bench}
repeat=${REPEAT:-5}
warm_tensors=${WARM_TENSORS:-16MiBx64,64MiBx16,256MiBx4,700MiBx2}
cold_tensors=${COLD_TENSORS:-64MiBx32,256MiBx8,512MiBx6}
python=${PYTHON:-python3}
modes=${MODES:-warm latency duplex cold}
weights=${WEIGHTS:-random}
bench=$bundle/bin/gpu_path_bench
mkdir -p "$work"
exec > >(tee "$out/bench.log") 2>&1

[[ -x "$bundle/fio/fio" ]] || tar xJf "$bundle/fio.tar.xz" -C "$bundle"
cat > "$bundle/fio/run" <<RUN
#!/bin/sh
LD_LIBRARY_PATH=$bundle/fio/lib exec $bundle/fio/fio "\$@"
RUN
chmod +x "$bundle/fio/run"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader 2>&1 | head -n 1)"
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); kernel $(uname -r)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
  echo "filesystem of $work: $(df -hT "$work" | tail -n 1)"
  echo "fio: $("$bundle/fio/run" --version)"
  echo "python: $("$python" -c 'import sys, torch, safetensors; print(sys.version.split()[0], "torch", torch.__version__, "safetensors", safetensors.__version__)' 2>&1 | tail -n 1)"
} | tee "$out/environment.txt"

for model in warm cold; do
  tensors=$warm_tensors
  [[ $model == cold ]] && tensors=$cold_tensors
  files=1
  [[ $model == cold ]] && files=4
  stamp="$work/$model/.tensors"
  if [[ "$(cat "$stamp" 2>/dev/null)" != "$tensors/$files/$weights" ]]; then
    rm -rf "$work/$model"
    "$bench" --mode=make-model --model-dir="$work/$model" --tensors="$tensors" --files=$files \
      --weights="$weights" || exit 1
    echo "$tensors/$files/$weights" > "$stamp"
  fi
done

socket=$work/tierd.sock
rm -rf "$work/state" "$socket"
# Room for both models and the duplex stores in the host cache and on the GPU.
"$bundle/bin/tierd" --device="${DEVICE:-cuda:0}" --socket="$socket" --state-dir="$work/state" \
  --host-cache-bytes=${HOST_CACHE_BYTES:-24GiB} --gpu-pool-bytes=${GPU_POOL_BYTES:-24GiB} ${TIERD_FLAGS:-} > "$out/tierd.log" 2>&1 &
tierd_pid=$!
trap 'kill -TERM $tierd_pid 2>/dev/null; wait $tierd_pid' EXIT
for _ in $(seq 300); do "$bundle/bin/tierctl" --socket="$socket" health >/dev/null 2>&1 && break; sleep 0.1; done
"$bundle/bin/tierctl" --socket="$socket" health || { cat "$out/tierd.log"; exit 1; }

status=0
for mode in $modes; do
  echo "## $mode"
  model=warm
  [[ $mode == cold ]] && model=cold
  extra=()
  [[ $mode == cold ]] && extra=(--fio="${FIO-fio/run}" --python="$python"
                                --safetensors-script="${SAFETENSORS_SCRIPT-bench/safetensors_load.py}")
  (cd "$bundle" && bin/gpu_path_bench --mode=$mode --socket="$socket" --model=$model \
    --model-dir="$work/$model" --repeat="$repeat" --json="$out/$mode.json" "${extra[@]}" ${BENCH_FLAGS:-} \
    > /dev/null) || status=1
done
"$bundle/bin/tierctl" --socket="$socket" stats
exit $status
