#!/usr/bin/env bash
# python/tests/run.sh --root DIR [--device host|cuda:N] [--installed] [unittest arguments...]
#
# Runs the Python client's tests against real daemons. DIR holds bin/tierd and python/tierd (a
# build tree, or a bundle from deploy/bundle.sh --tests). With --installed the tests use the tierd
# package the interpreter has installed (a wheel in a virtual environment) instead of DIR's. The
# interpreter is $TIERD_PYTHON, else the first of python3 and /usr/bin/python3 that has torch,
# grpcio and protobuf. With a cuda device and no usable GPU the tests report themselves skipped
# (exit 77) unless TIERD_REQUIRE_GPU=1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=
device=host
installed=0
while (($# > 0)); do
  case $1 in
    --root) root=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --installed) installed=1; shift ;;
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
package_dir=$root/python
if ((installed)); then
  package_dir=
  echo "run.sh: the installed tierd: $(cd / && "$python" -c 'import tierd; print(tierd.__version__, tierd.__file__)')"
fi
export PYTHONPATH="${package_dir:+$package_dir:}$here/../examples:$here${PYTHONPATH:+:$PYTHONPATH}"
export TIERD_BIN="$root/bin/tierd"
export TIERD_TEST_DEVICE="$device"
cd "$here"
exec "$python" -m unittest -v "$@"
