#!/usr/bin/env bash
# tests/run-gpu-tests.sh BUNDLE_DIR [LOG]
#
# On a GPU machine, from a bundle made by `deploy/bundle.sh --tests BUNDLE_DIR` (no build tree or
# -dev packages needed there): runs the GPU tests with TIERD_REQUIRE_GPU=1 (a GPU that cannot be
# used fails instead of skipping), then the host tests, then starts tierd with --device=auto and
# asks tierctl for its health. Everything is printed and, with LOG, also written there.
set -uo pipefail
bundle=$(cd "${1:?usage: tests/run-gpu-tests.sh BUNDLE_DIR [LOG]}" && pwd)
log=${2:-/dev/null}
# The record names the bundle "<bundle>", not the path it happened to be unpacked at.
exec > >(sed -u "s|$bundle|<bundle>|g" | tee "$log") 2>&1

echo "# tierd GPU test run"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
echo "host: $(uname -srm), $(nproc) cores"
echo

cd "$bundle"
status=0
echo "## TIERD_REQUIRE_GPU=1 ctest -L gpu --output-on-failure -V"
TIERD_REQUIRE_GPU=1 ctest -L gpu --output-on-failure -V || status=1
echo
echo "## ctest -LE gpu --output-on-failure"
ctest -LE gpu --output-on-failure || status=1
echo

echo "## tierd --device=auto, then tierctl health"
dir=$(mktemp -d)
bin/tierd --device=auto --socket="$dir/gpu0.sock" --state-dir="$dir/state" \
  --host-cache-bytes=1GiB --gpu-pool-bytes=1GiB &
pid=$!
for _ in $(seq 100); do bin/tierctl --socket="$dir/gpu0.sock" health >/dev/null 2>&1 && break; sleep 0.1; done
bin/tierctl --socket="$dir/gpu0.sock" health || status=1
kill -TERM "$pid"
wait "$pid" || status=1
rm -rf "$dir"
echo
echo "result: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit "$status"
