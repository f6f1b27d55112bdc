#!/usr/bin/env bash
# bench/run-kv-cache-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]
#
# On the GPU machine, from a bundle made by `deploy/bundle.sh --bench BUNDLE_DIR`: runs
# bench/kv_cache_bench.py (a Llama-architecture model decoding with its KV cache in tierd against
# transformers' own caches, and a second process continuing a saved prefix) with the bundle's
# tierd and Python package. Writes OUT_DIR/kv-cache.json and OUT_DIR/kv-cache.log. Needs torch and
# transformers. Environment: PYTHON (default python3), KV_BENCH_FLAGS (extra flags for the
# benchmark, e.g. --context=8192).
set -euo pipefail
bundle=$(cd "${1:?usage: run-kv-cache-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]}" && pwd)
out=$(mkdir -p "${2:?OUT_DIR}" && cd "$2" && pwd)
work=${3:-/var/tmp/tierd-kv-bench}
export PYTHONPATH="$bundle/python:$bundle/python/examples${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086
"${PYTHON:-python3}" "$bundle/bench/kv_cache_bench.py" --tierd "$bundle/bin/tierd" \
  --work-dir "$work" --json "$out/kv-cache.json" ${KV_BENCH_FLAGS:-} 2>&1 | tee "$out/kv-cache.log"
