#!/usr/bin/env bash
# tests/run-all.sh [CTEST ARGS...]: every test tierd has, as CI runs them.
#
#  1. Builds tierd with warnings as errors and runs the test suite (ctest), two tests per core:
#     most of a test's time is spent waiting on daemons, sockets and timeouts. On a machine with no
#     GPU, tests labelled "gpu" report themselves skipped; on a GPU machine they run.
#  2. Runs the suite under ASan+UBSan and its concurrent part under TSan (tests/run-sanitizers.sh;
#     TIERD_SANITIZERS=0 leaves them out).
#  3. Runs the fuzzers side by side, each for FUZZ_SECONDS (default 30) from its seed corpus
#     (tests/run-fuzzers.sh), built with the ASan tree of step 2 (or here, when step 2 is left out).
#  4. Writes the figures the run recorded to BUILD_DIR/RELIABILITY.md (tests/reliability_report.py;
#     tests/reliability-report.sh makes docs/RELIABILITY.md this way). Left out when CTEST ARGS
#     select part of the suite.
# Every step runs even when an earlier one failed; the exit status is 1 if any did.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
deploy/install-deps.sh
# Line tables only (-g1): full debug information at -O2 took wire/session_core.cc 10.7 s to
# compile against 6.1 s (GCC's variable tracking), and a test run has no use for it.
BUILD_DIR=$build deploy/build.sh -DTIERD_WERROR=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"

failed=()
step() {  # step NAME COMMAND...: runs it, timed, and notes a failure
  local name=$1 start=$SECONDS
  shift
  echo "run-all: $name"
  "$@" || failed+=("$name")
  echo "run-all: $name took $((SECONDS - start)) s"
}
ctest_in() {  # ctest_in DIR ARGS...: ctest, two tests a core, JSON reports in DIR/test-results
  local dir=$1
  shift
  rm -rf "$dir/test-results" "$dir/Testing/Temporary/LastTestsFailed.log"
  (cd "$dir" && GTEST_OUTPUT="json:$PWD/test-results/" \
     ctest --output-on-failure --parallel "$((2 * $(nproc)))" "$@")
}

step tests ctest_in "$build" "$@"
report_args=(--gtest "$build/test-results")
if [[ ${TIERD_SANITIZERS:-1} != 0 ]]; then
  step sanitizers tests/run-sanitizers.sh
  report_args+=(--gtest-asan build-asan/test-results --gtest-tsan build-tsan/test-results)
fi
step fuzzers tests/run-fuzzers.sh "${FUZZ_SECONDS:-30}"
report_args+=(--fuzz-logs build-asan/fuzzing/logs)
if (($# == 0)); then
  step report python3 tests/reliability_report.py "${report_args[@]}" \
    --command "${RELIABILITY_COMMAND:-tests/run-all.sh}" --out "$build/RELIABILITY.md"
fi

if ((${#failed[@]} > 0)); then
  # Last, where a log cut to its head and tail still shows it: which cases failed, and how.
  python3 tests/failure_summary.py "$build" build-asan build-tsan
  echo "run-all: FAILED: ${failed[*]}"
  exit 1
fi
echo "run-all: everything passed"
