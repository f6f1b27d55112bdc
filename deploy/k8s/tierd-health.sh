#!/usr/bin/env bash
# tierd-health [--timeout-ms=N]   (installed in the image as /opt/tierd/bin/tierd-health)
#
# The DaemonSet's startup and readiness probe: exits 0 when every tierd that tierd-node started on
# this node answers SERVING to `tierctl health`, 1 otherwise (naming the sockets that did not), and
# 2 on bad usage. The sockets are those listed in $TIERD_NODE_SOCKETS_FILE
# [/tmp/tierd-node.sockets], which tierd-node writes once it has started every daemon, so a pod
# whose daemons are not all started yet is not ready either. --timeout-ms bounds each check [3000].
# tierctl is found beside this script, or at $TIERCTL_BIN.
set -euo pipefail
prog="tierd-health"
usage="usage: tierd-health [--timeout-ms=N]"

timeout_ms=3000
for arg in "$@"; do
  case $arg in
    --timeout-ms=*) timeout_ms=${arg#*=} ;;
    -h | --help) echo "$usage"; exit 0 ;;
    *) echo "$prog: unknown argument: $arg" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
[[ $timeout_ms =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --timeout-ms must be a positive number, not: $timeout_ms" >&2; exit 2; }

tierctl=${TIERCTL_BIN:-$(dirname "$0")/tierctl}
sockets_file=${TIERD_NODE_SOCKETS_FILE:-/tmp/tierd-node.sockets}
[[ -x $tierctl ]] || { echo "$prog: no tierctl at $tierctl (set TIERCTL_BIN)" >&2; exit 1; }
if [[ ! -s $sockets_file ]]; then
  echo "$prog: not ready: $sockets_file is missing (tierd-node has not started every daemon yet)"
  exit 1
fi

failed=()
count=0
while IFS= read -r socket; do
  [[ -n $socket ]] || continue
  count=$((count + 1))
  if ! answer=$("$tierctl" --socket="$socket" --timeout-ms="$timeout_ms" health 2>&1); then
    failed+=("$socket (${answer//$'\n'/ })")
  fi
done <"$sockets_file"
if ((${#failed[@]} > 0)); then
  echo "$prog: ${#failed[@]} of $count daemons not serving: ${failed[*]}"
  exit 1
fi
echo "$prog: all $count daemons serving"
