#!/usr/bin/env bash
# tests/run-fuzzers.sh [SECONDS]
#
# Builds the libFuzzer fuzzers (fuzz/) in the ASan+UBSan tree, build-asan/ (clang 14; configured by
# tests/run-sanitizers.sh, which builds them with the rest of that tree: after it, nothing is left
# to build), and runs them side by side, each for SECONDS (default 60) from its seed corpus in
# tests/fuzz_corpus/NAME, after replaying every input in tests/fuzz_regressions/NAME (inputs that
# once crashed it: each must now pass). New corpus entries stay in build-asan/fuzzing/corpus/NAME; a
# crash leaves its input in build-asan/fuzzing/crashes/ and fails the run: fix the bug, then add the
# input to tests/fuzz_regressions/NAME.
# Prints one line per fuzzer with its executions; exits 0 when none crashed.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: tests/run-fuzzers.sh [SECONDS]" >&2; exit 2; }
build="build-asan"
out="$build/fuzzing"
fuzzers=(safetensors_header_fuzzer session_fuzzer session_request_fuzzer exponent_decoder_fuzzer)

tests/run-sanitizers.sh --configure address
echo "run-fuzzers: building ${fuzzers[*]} in $build"
cmake --build "$build" --parallel "$(nproc)" --target "${fuzzers[@]}"

mkdir -p "$out/crashes" "$out/logs"

# fuzz FUZZER: replays its regression inputs, then fuzzes it; prints one line; fails on a crash.
fuzz() {
  local fuzzer=$1 binary=$build/bin/$1 regressions corpus log runs
  regressions=(tests/fuzz_regressions/"$fuzzer"/*)
  if ((${#regressions[@]} > 0)); then
    if ! "$binary" "${regressions[@]}" >"$out/logs/$fuzzer-regressions.log" 2>&1; then
      echo "run-fuzzers: $fuzzer FAILED on a regression input; see $out/logs/$fuzzer-regressions.log"
      return 1
    fi
  fi
  corpus=$out/corpus/$fuzzer
  mkdir -p "$corpus"
  log=$out/logs/$fuzzer.log
  if "$binary" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$out/crashes/$fuzzer-" "$corpus" "tests/fuzz_corpus/$fuzzer" >"$log" 2>&1; then
    runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "run-fuzzers: $fuzzer: $runs executions in ${seconds} s, ${#regressions[@]} regression input(s) replayed, no crash"
  else
    echo "run-fuzzers: $fuzzer CRASHED; input in $out/crashes/, log $log:"
    tail -n 30 "$log" | sed 's/^/    /'
    return 1
  fi
}

# The fuzzers run side by side (each is one process on one core), so the step takes SECONDS
# however many there are; on a machine with fewer cores than fuzzers they share them.
echo "run-fuzzers: running ${#fuzzers[@]} fuzzers side by side for $seconds s"
pids=()
for fuzzer in "${fuzzers[@]}"; do
  fuzz "$fuzzer" >"$out/logs/$fuzzer.summary" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!fuzzers[@]}"; do
  wait "${pids[$i]}" || status=1
  cat "$out/logs/${fuzzers[$i]}.summary"
done
exit "$status"
