#!/usr/bin/env bash
# tierd-node [TIERD_FLAG...]   (installed in the image as /opt/tierd/bin/tierd-node)
#
# Starts one tierd per GPU of the node and supervises them: the entry point of the Kubernetes
# DaemonSet (deploy/k8s/tierd-daemonset.yaml), where one container serves every GPU. GPU N gets
#   tierd [--config=$TIERD_CONFIG] --device=${TIERD_DEVICE_PREFIX}N \
#         --socket=$TIERD_SOCKET_DIR/gpuN.sock --state-dir=$TIERD_STATE_DIR/gpuN \
#         --metrics-port=$((TIERD_METRICS_BASE_PORT + N)) --peers=EVERY_GPU'S_SOCKET TIERD_FLAG...
# TIERD_FLAGs (any flags of tierd) are passed to every daemon and replace those above of the same
# name, which tierd would refuse as given twice (--peers= turns the handoff between the GPUs'
# daemons off).
#
# Environment (defaults in brackets):
#   TIERD_GPUS               number of GPUs [nvidia-smi -L, else the count of /dev/nvidia[0-9]*]
#   TIERD_CONFIG             config file [/etc/tierd/tierd.conf]; not passed when it does not exist
#   TIERD_DEVICE_PREFIX      [cuda:]; "host" runs every daemon with --device=host (no GPU needed)
#   TIERD_SOCKET_DIR         [/run/tierd]
#   TIERD_STATE_DIR          [/var/lib/tierd]
#   TIERD_METRICS_BASE_PORT  [9400]; 0 turns metrics off (--metrics-port=0 for every GPU)
#   TIERD_BIN                the tierd binary [tierd beside this script]
#   TIERD_NODE_SOCKETS_FILE  [/tmp/tierd-node.sockets] where the sockets are listed, one per line,
#                            once every daemon is started; tierd-health reads it (readiness probe)
#   TIERD_NODE_STOP_TIMEOUT  seconds the daemons get to exit after SIGTERM before SIGKILL [25]
#
# SIGTERM or SIGINT: every daemon gets SIGTERM; tierd-node waits for all of them and exits with the
# first non-zero exit status among them (0 when all exit 0). A daemon that exits on its own makes
# tierd-node stop the others and exit non-zero, so that Kubernetes restarts the pod. With
# nvidia-smi, /run/tierd/by-uuid/GPU-UUID.sock (and .session.sock) link to each GPU's sockets, so a
# model server that sees only its own GPU finds its daemon by the GPU's UUID.
set -euo pipefail
prog="tierd-node"

die() { echo "$prog: error: $*" >&2; exit 1; }
bad_usage() { echo "$prog: $*" >&2; echo "usage: tierd-node [TIERD_FLAG...] (see the header of this script)" >&2; exit 2; }

for arg in "$@"; do
  case $arg in
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) ;;
    *) bad_usage "arguments are tierd flags (--name=value), not: $arg" ;;
  esac
done

# wait -n -p (which daemon exited) needs bash 5.1.
((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 501)) || die "needs bash 5.1 or newer, not $BASH_VERSION"
tierd=${TIERD_BIN:-$(dirname "$0")/tierd}
config=${TIERD_CONFIG:-/etc/tierd/tierd.conf}
device_prefix=${TIERD_DEVICE_PREFIX:-cuda:}
socket_dir=${TIERD_SOCKET_DIR:-/run/tierd}
state_dir=${TIERD_STATE_DIR:-/var/lib/tierd}
metrics_base=${TIERD_METRICS_BASE_PORT:-9400}
sockets_file=${TIERD_NODE_SOCKETS_FILE:-/tmp/tierd-node.sockets}
stop_timeout=${TIERD_NODE_STOP_TIMEOUT:-25}

if [[ ! $metrics_base =~ ^[0-9]{1,5}$ ]] || ((10#$metrics_base > 65535)); then
  bad_usage "TIERD_METRICS_BASE_PORT must be a port number or 0, not: $metrics_base"
fi
metrics_base=$((10#$metrics_base))
[[ $stop_timeout =~ ^[1-9][0-9]*$ ]] || bad_usage "TIERD_NODE_STOP_TIMEOUT must be a number of seconds, not: $stop_timeout"
[[ -x $tierd ]] || die "no tierd binary at $tierd (install it beside this script or set TIERD_BIN)"

# ---- How many GPUs --------------------------------------------------------------------------------
if [[ -n ${TIERD_GPUS:-} ]]; then
  [[ $TIERD_GPUS =~ ^[1-9][0-9]*$ ]] || bad_usage "TIERD_GPUS must be a number of GPUs (1 or more), not: $TIERD_GPUS"
  gpus=$TIERD_GPUS
  echo "$prog: $gpus GPUs (TIERD_GPUS)"
elif command -v nvidia-smi >/dev/null 2>&1 && listing=$(nvidia-smi -L 2>&1); then
  gpus=$(grep -c '^GPU ' <<<"$listing" || true)
  echo "$prog: $gpus GPUs (nvidia-smi -L)"
else
  shopt -s nullglob
  nodes=(/dev/nvidia[0-9]*)
  shopt -u nullglob
  gpus=${#nodes[@]}
  echo "$prog: $gpus GPUs (/dev/nvidia[0-9]*; no working nvidia-smi)"
fi
((gpus > 0)) || die "no GPU found (is the pod running with runtimeClassName: nvidia and NVIDIA_VISIBLE_DEVICES=all? set TIERD_GPUS to override)"
((metrics_base == 0 || metrics_base + gpus - 1 <= 65535)) || bad_usage "TIERD_METRICS_BASE_PORT $metrics_base + $gpus GPUs runs past port 65535"

# ---- Flags common to every daemon ------------------------------------------------------------------
# The TIERD_FLAGs by name, dashes as underscores, as tierd reads them.
declare -A given=()
for arg in "$@"; do
  name=${arg#-}
  name=${name#-}
  name=${name%%=*}
  given[${name//-/_}]=1
done
# Appends --NAME=VALUE to the array named by $1 unless a TIERD_FLAG sets NAME.
add_flag() {
  local -n into=$1
  local name=$2 value=$3
  [[ -n ${given[${name//-/_}]:-} ]] || into+=("--$name=$value")
}

common=()
if [[ -n ${given[config]:-} ]]; then
  :
elif [[ -e $config ]]; then
  common+=("--config=$config")
else
  echo "$prog: no config file $config: running with the flags' defaults"
fi

memlock=$(ulimit -l)
if [[ $memlock != unlimited ]]; then
  echo "$prog: warning: the memlock limit is $memlock KiB, not unlimited: pinning the host cache may fail" \
    "(raise LimitMEMLOCK of the container runtime's service; see deploy/k8s/README.md)" >&2
fi

mkdir -p "$socket_dir" "$state_dir" || die "cannot create $socket_dir and $state_dir"
rm -f "$sockets_file"

# ---- Start ----------------------------------------------------------------------------------------
declare -A gpu_of=()  # pid -> GPU index, for the daemons still running
pids=()
sockets=()
peers=
for ((n = 0; n < gpus; n++)); do peers+="${peers:+,}$socket_dir/gpu$n.sock"; done
for ((n = 0; n < gpus; n++)); do
  if [[ $device_prefix == host ]]; then device=host; else device=$device_prefix$n; fi
  socket=$socket_dir/gpu$n.sock
  args=("${common[@]}")
  add_flag args device "$device"
  add_flag args socket "$socket"
  add_flag args state-dir "$state_dir/gpu$n"
  add_flag args metrics-port "$((metrics_base == 0 ? 0 : metrics_base + n))"
  add_flag args peers "$peers"
  args+=("$@")
  # Each daemon's log lines are prefixed with its GPU; they all go to this container's output.
  "$tierd" "${args[@]}" > >(sed -u "s/^/[gpu$n] /") 2>&1 &
  pid=$!
  gpu_of[$pid]=$n
  pids+=("$pid")
  sockets+=("$socket")
  echo "$prog: started tierd for GPU $n (pid $pid): $tierd ${args[*]}"
done
printf '%s\n' "${sockets[@]}" >"$sockets_file.tmp" && mv "$sockets_file.tmp" "$sockets_file"

# Stable names for model servers that see only their own GPU: by-uuid/GPU-....sock -> ../gpuN.sock.
if [[ $device_prefix == cuda: ]] && command -v nvidia-smi >/dev/null 2>&1 &&
  uuids=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null); then
  rm -rf "$socket_dir/by-uuid"
  mkdir -p "$socket_dir/by-uuid"
  while IFS=', ' read -r index uuid; do
    if [[ ! $index =~ ^[0-9]+$ ]] || ((index >= gpus)); then continue; fi
    ln -sfn "../gpu$index.sock" "$socket_dir/by-uuid/$uuid.sock"
    ln -sfn "../gpu$index.session.sock" "$socket_dir/by-uuid/$uuid.session.sock"
    echo "$prog: GPU $index is $uuid: $socket_dir/by-uuid/$uuid.sock"
  done <<<"$uuids"
fi

# ---- Supervise --------------------------------------------------------------------------------------
stopping=0
killer=
exit_status=0

stop_all() {  # $1: why
  ((stopping)) && return 0
  stopping=1
  echo "$prog: $1: sending SIGTERM to ${#gpu_of[@]} daemons"
  if ((${#gpu_of[@]} > 0)); then kill -TERM "${!gpu_of[@]}" 2>/dev/null || true; fi
  # Daemons still there after the timeout get SIGKILL (Kubernetes would, after the grace period).
  (
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    sleep "$stop_timeout" &
    sleeper=$!
    wait "$sleeper"
    echo "$prog: daemons still running after ${stop_timeout}s: sending SIGKILL" >&2
    kill -KILL "${pids[@]}" 2>/dev/null || true
  ) &
  killer=$!
  return 0
}
# Forwarded as SIGTERM: tierd stops the same way on both, and a background job of a
# non-interactive shell ignores SIGINT.
trap 'stop_all "received SIGTERM"' TERM
trap 'stop_all "received SIGINT"' INT

while ((${#gpu_of[@]} > 0)); do
  done_pid=
  status=0
  wait -n -p done_pid "${!gpu_of[@]}" || status=$?
  [[ -n ${done_pid:-} ]] || continue  # interrupted by a signal; its trap has run
  n=${gpu_of[$done_pid]}
  unset "gpu_of[$done_pid]"
  if ((status > 128)); then
    echo "$prog: tierd for GPU $n (pid $done_pid) was killed by signal $((status - 128)) (status $status)"
  else
    echo "$prog: tierd for GPU $n (pid $done_pid) exited with status $status"
  fi
  if ((!stopping)); then
    # A daemon that ends by itself, even with 0, leaves its GPU unserved: restart the pod.
    ((status != 0)) || status=1
    stop_all "tierd for GPU $n exited on its own"
  fi
  ((exit_status != 0 || status == 0)) || exit_status=$status
done
if [[ -n $killer ]]; then kill -TERM "$killer" 2>/dev/null || true; wait "$killer" 2>/dev/null || true; fi
rm -f "$sockets_file"
echo "$prog: all daemons stopped; exiting with status $exit_status"
exit "$exit_status"
