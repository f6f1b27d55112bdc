#!/usr/bin/env bash
# python/tests/run.sh --root DIR [--device host|cuda:N] [unittest arguments...]
#
# Runs the Python client's tests against real daemons. DIR holds bin/tierd and python/tierd (a
# build tree, or a bundle from deploy/bundle.sh --tests). The interpreter is $TIERD_PYTHON, else the
# first of python3 and /usr/bin/python3 that has torch, grpcio and protobuf. With a cuda device and
# no usable GPU the tests report themselves skipped (exit 77) unless TIERD_REQUIRE_GPU=1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=
device=host
while (($# > 0)); do
  case $1 in
    --root) root=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    *) break ;;
  esac
done
[[ -n "$root" && -x "$root/bin/tierd" && -d "$root/python/tierd" ]] || {
  echo "run.sh: --root must hold bin/tierd and python/tierd (got '$root')" >&2; exit 2; }
root=$(cd "$root" && pwd)

python=${TIERD_PYTHON:-}
if [[ -z "$python" ]]; then
  for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null &&
       "$candidate" -c 'import torch, grpc, google.protobuf' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
fi
[[ -n "$python" ]] || {
  echo "run.sh: no Python with torch, grpcio and protobuf (deploy/install-deps.sh installs them)" >&2
  exit 1; }

if [[ $device == cuda* && ${TIERD_REQUIRE_GPU:-0} != 1 ]] &&
   ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "run.sh: no usable GPU; skipping the $device tests"
  exit 77
fi

echo "run.sh: $("$python" -c 'import sys, torch, grpc, google.protobuf as p; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, grpcio {grpc.__version__}, protobuf {p.__version__}")')"
export PYTHONPATH="$root/python:$here/../examples:$here${PYTHONPATH:+:$PYTHONPATH}"
export TIERD_BIN="$root/bin/tierd"
export TIERD_TEST_DEVICE="$device"
cd "$here"
exec "$python" -m unittest -v "$@"
