#!/usr/bin/env bash
# From a fresh clone on Debian 12: install dependencies, build, start a tierd in the background
# (on the GPU when one is visible, otherwise on the host backend), ask it for its health and run the
# Python demo against it (python/examples/dit_streaming.py).
# State, socket and log go under ./run; stop it with: kill "$(cat run/tierd.pid)"
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
deploy/build.sh

mkdir -p run
if [[ -f run/tierd.pid ]] && kill -0 "$(cat run/tierd.pid)" 2>/dev/null; then
  echo "quickstart: stopping the tierd started earlier (pid $(cat run/tierd.pid))"
  kill "$(cat run/tierd.pid)"
  while kill -0 "$(cat run/tierd.pid)" 2>/dev/null; do sleep 0.1; done
fi
socket="$PWD/run/tierd.sock"
build/bin/tierd --device=auto --socket="$socket" --state-dir="$PWD/run/state" \
  --host-cache-bytes=1GiB --gpu-pool-bytes=512MiB >run/tierd.log 2>&1 &
echo $! >run/tierd.pid

for _ in $(seq 100); do
  build/bin/tierctl --socket="$socket" health >/dev/null 2>&1 && break
  sleep 0.1
done
echo "quickstart: tierd running (pid $(cat run/tierd.pid)), log in run/tierd.log:"
sed 's/^/  /' run/tierd.log
echo "quickstart: \$ build/bin/tierctl --socket=$socket health"
build/bin/tierctl --socket="$socket" health

# The demo: a small DiT saved as safetensors, registered, and run with its blocks streamed from the
# daemon through the Python client; its output is checked against the all-resident run.
demo=(env PYTHONPATH=build/python /usr/bin/python3 python/examples/dit_streaming.py
  --socket "$socket" --model-dir run/models/dit-example)
echo "quickstart: \$ ${demo[*]}"
"${demo[@]}"
echo "quickstart: stop it with: kill \"\$(cat run/tierd.pid)\""
