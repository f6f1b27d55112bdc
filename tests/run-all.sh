#!/usr/bin/env bash
# Builds tierd with warnings as errors and runs the whole test suite (ctest), then builds the
# fuzzers and runs each for FUZZ_SECONDS (default 30) from its seed corpus (tests/run-fuzzers.sh).
# On a machine with no GPU, tests labelled "gpu" report themselves skipped; on a GPU machine they
# run.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build} deploy/build.sh -DTIERD_WERROR=ON
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure --parallel "$(nproc)" "$@")
tests/run-fuzzers.sh "${FUZZ_SECONDS:-30}"
