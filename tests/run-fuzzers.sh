#!/usr/bin/env bash
# tests/run-fuzzers.sh [SECONDS]
#
# Builds the libFuzzer fuzzers (fuzz/: clang 14 with ASan and UBSan, in build-fuzz/) and runs them
# side by side, each for SECONDS (default 60) from its seed corpus in tests/fuzz_corpus/NAME, after
# replaying every input in tests/fuzz_regressions/NAME (inputs that once crashed it: each must now
# pass). New corpus entries stay in build-fuzz/corpus/NAME; a crash leaves its input in
# build-fuzz/crashes/ and fails the run: fix the bug, then add the input to
# tests/fuzz_regressions/NAME.
# Prints one line per fuzzer with its executions; exits 0 when none crashed.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: tests/run-fuzzers.sh [SECONDS]" >&2; exit 2; }
build="build-fuzz"
fuzzers=(safetensors_header_fuzzer session_fuzzer session_request_fuzzer exponent_decoder_fuzzer)

if [[ ! -f $build/CMakeCache.txt ]]; then
  # -O1 without debug info: quick to build on a small CI machine, and still fast to fuzz.
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja -DTIERD_FUZZ=ON -DTIERD_WITH_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" >/dev/null
fi
echo "run-fuzzers: building ${fuzzers[*]} in $build"
cmake --build "$build" --parallel "$(nproc)" --target "${fuzzers[@]}"

mkdir -p "$build/crashes" "$build/logs"

# fuzz FUZZER: replays its regression inputs, then fuzzes it; prints one line; fails on a crash.
fuzz() {
  local fuzzer=$1 binary=$build/bin/$1 regressions corpus log runs
  regressions=(tests/fuzz_regressions/"$fuzzer"/*)
  if ((${#regressions[@]} > 0)); then
    if ! "$binary" "${regressions[@]}" >"$build/logs/$fuzzer-regressions.log" 2>&1; then
      echo "run-fuzzers: $fuzzer FAILED on a regression input; see $build/logs/$fuzzer-regressions.log"
      return 1
    fi
  fi
  corpus=$build/corpus/$fuzzer
  mkdir -p "$corpus"
  log=$build/logs/$fuzzer.log
  if "$binary" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$build/crashes/$fuzzer-" "$corpus" "tests/fuzz_corpus/$fuzzer" >"$log" 2>&1; then
    runs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "run-fuzzers: $fuzzer: $runs executions in ${seconds} s, ${#regressions[@]} regression input(s) replayed, no crash"
  else
    echo "run-fuzzers: $fuzzer CRASHED; input in $build/crashes/, log $log:"
    tail -n 30 "$log" | sed 's/^/    /'
    return 1
  fi
}

# The fuzzers run side by side (each is one process on one core), so the step takes SECONDS
# however many there are; on a machine with fewer cores than fuzzers they share them.
echo "run-fuzzers: running ${#fuzzers[@]} fuzzers side by side for $seconds s"
pids=()
for fuzzer in "${fuzzers[@]}"; do
  fuzz "$fuzzer" >"$build/logs/$fuzzer.summary" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!fuzzers[@]}"; do
  wait "${pids[$i]}" || status=1
  cat "$build/logs/${fuzzers[$i]}.summary"
done
exit "$status"
