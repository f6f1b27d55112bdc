# Sourced by tests/package/*.sh: a scratch directory removed at exit, failing with a message, and
# a host-backend daemon to run clients against.
set -euo pipefail
work=$(mktemp -d "${TMPDIR:-/tmp}/tierd-package-test.XXXXXX")
daemon_pid=
cleanup() {
  if [[ -n $daemon_pid ]]; then kill -TERM "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# start_daemon TIERD TIERCTL: a host-backend daemon on $work/tierd.sock (small pools), up and
# answering health when this returns.
start_daemon() {
  "$1" --device=host --socket="$work/tierd.sock" --state-dir="$work/state" \
    --host-cache-bytes=64MiB --gpu-pool-bytes=16MiB 2> "$work/daemon.log" &
  daemon_pid=$!
  for _ in $(seq 200); do
    "$2" --socket="$work/tierd.sock" health > /dev/null 2>&1 && return 0
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.05
  done
  cat "$work/daemon.log" >&2
  fail "the daemon did not come up"
}
