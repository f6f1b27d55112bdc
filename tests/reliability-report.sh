#!/usr/bin/env bash
# tests/reliability-report.sh [FUZZ_SECONDS] [SOAK_SECONDS]
#
# Regenerates docs/RELIABILITY.md: runs the whole suite as CI does (tests/run-all.sh: the tests,
# the fuzzers, and the ASan+UBSan and TSan builds), with each fuzzer running FUZZ_SECONDS (default
# 120) and the soak test SOAK_SECONDS (default 60), then writes the figures the run recorded.
# Fails, leaving the report written, when any part failed.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=${1:-120}
soak_seconds=${2:-60}
[[ $fuzz_seconds =~ ^[0-9]+$ && $soak_seconds =~ ^[0-9]+$ ]] ||
  { echo "usage: tests/reliability-report.sh [FUZZ_SECONDS] [SOAK_SECONDS]" >&2; exit 2; }

status=0
FUZZ_SECONDS=$fuzz_seconds TIERD_SOAK_SECONDS=$soak_seconds \
  RELIABILITY_COMMAND="tests/reliability-report.sh $fuzz_seconds $soak_seconds" \
  tests/run-all.sh || status=$?
cp "${BUILD_DIR:-build}/RELIABILITY.md" docs/RELIABILITY.md
echo "reliability-report: wrote docs/RELIABILITY.md"
exit "$status"
