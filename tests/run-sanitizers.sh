#!/usr/bin/env bash
# tests/run-sanitizers.sh [--configure] [address|thread]... (default: both)
#
# Builds tierd with sanitizers (host backend only: no GPU on a CI machine) and runs its tests:
#   address  ASan + UBSan with clang 14, in build-asan/: the whole suite but the deployment test
#            (which checks packaging, not memory), the benchmarks' programs and the GPU tests. The
#            tree also builds the fuzzers (-DTIERD_FUZZ=ON: the library instrumented for
#            libFuzzer's coverage too), which tests/run-fuzzers.sh runs: one build serves both.
#   thread   TSan, in build-tsan/: the tests of the concurrent parts — the host arena, cache and
#            disk reader, the checksum hashed as a read's chunks land, the GPU tier, the session protocol and the durable store in process, the
#            daemon in process (health, faults, metrics), the API against real daemon processes,
#            the node's host tier (a peer's arena, three daemons), two threads' first log lines,
#            and the remote tier against a store that misbehaves (the S3 client, the remote
#            reader, cache and scan, and the daemon on it). Debian's Abseil is not built with
#            TSan, so every test preloads
#            tests/tsan/absl_sync_annotations.cc's library, which tells TSan what absl::Mutex
#            does; tests/tsan/suppressions.txt says what is left out of uninstrumented libraries.
#            GCC's TSan: its runtime is a shared library, which that preloaded library needs in
#            every process a test starts (clang links the runtime into each program).
# Each mode's build runs, at a lower priority, beside the tests of the mode before it: the tests
# leave part of the machine idle (they wait on daemons, sockets and timeouts); the last mode's
# tests, with nothing beside them, run two per core. Any finding fails
# the test that provoked it. Each test binary's JSON report goes to BUILD/test-results
# (tests/reliability_report.py reads them). Extra ctest arguments come from $CTEST_ARGS.
# --configure only configures the modes' trees that are not yet configured, and builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
modes=("$@")
((${#modes[@]} > 0)) || modes=(address thread)
tsan_tests=(host_arena_test host_cache_test disk_reader_test daemon_health_test
            fault_injection_test metrics_test api_test_host client_groups_test_host
            peer_handoff_test_host half_close_test unread_answer_budget_test gpu_tier_test
            session_protocol_test session_core_test durable_store_test worker_pool_test peer_arena_test_host
            node_host_tier_test_host log_line_test remote_cache_test remote_reader_test
            remote_model_scan_test s3_client_hostile_test remote_hostile_test streaming_checksum_test
            staging_loader_test)

# settings MODE: sets build, sanitize, compilers, benchmarks, fuzz, targets, select and skips for
# MODE.
settings() {
  case $1 in
    address) build="build-asan"; sanitize=address,undefined; compilers=(clang-14 clang++-14)
             fuzz=ON
             # Everything but the benchmarks' programs (their tests check what they report, not
             # memory).
             benchmarks=OFF; targets=(all); select=(-LE gpu -E '^deploy_test$'); skips=() ;;
    thread)  build="build-tsan"; sanitize=thread; compilers=(gcc g++); benchmarks=ON; fuzz=OFF
             # Left to the plain and ASan runs: a hundred client processes started and killed
             # (minutes under TSan), and cases whose threads are those of a case kept here, with
             # other inputs — command-line tools and flags, statuses, identities, a shard walk,
             # and the handoff's copy through the host, whose protocol and threads the direct
             # copy's cases run (about 250 s of TSan's time).
             skips=(ApiTest.AHundredClientsKilledMidLeaseLeaveNothingBehind
                    'ApiTest.Tierctl*' ApiTest.EachFailureHasItsPreciseStatus
                    NodeHostTierTest.EachShardIsReadOnceForTheNode
                    NodeHostTierTest.ADaemonWithTheModelFromOtherFilesIsNeitherLentNorBorrowedFrom
                    NodeHostTierTest.HostLeasesNeedANode 'PeerFlagsTest.*'
                    '*PeerHandoffTest.AKeyNoDaemonHasIsNotFoundWithoutLooping/*'
                    'CopyPaths/PeerHandoffTest.*/ThroughHost'
                    ClientGroupsTest.BadClientGroupsAreRefused)
             targets=("${tsan_tests[@]}" tierd tierctl api_peer tierd_tsan_absl)
             select=(-R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$") ;;
    *) echo "usage: tests/run-sanitizers.sh [--configure] [address|thread]..." >&2; exit 2 ;;
  esac
}

# configure_mode MODE: configures MODE's tree unless it is configured already (with the fuzzers
# or without, as MODE asks).
configure_mode() {
  settings "$1"
  if [[ ! -f $build/CMakeCache.txt ]]; then
    # -O1 with line tables (-g1): reports name files and lines, and a small CI machine builds it
    # in minutes.
    CC=${compilers[0]} CXX=${compilers[1]} cmake -S . -B "$build" -G Ninja \
      -DTIERD_SANITIZE="$sanitize" -DTIERD_WITH_CUDA=OFF -DTIERD_WERROR=ON \
      -DTIERD_BENCHMARKS="$benchmarks" -DTIERD_FUZZ="$fuzz" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      >/dev/null
  elif ! grep -qx "TIERD_FUZZ:BOOL=$fuzz" "$build/CMakeCache.txt"; then
    cmake -S . -B "$build" -DTIERD_FUZZ="$fuzz" >/dev/null  # a tree configured before the fuzzers
  fi
}

# build_mode MODE: configures (once) and builds MODE's tree.
build_mode() {
  configure_mode "$1"
  echo "run-sanitizers: building ($sanitize) in $build"
  cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]}"
}

# test_mode MODE JOBS: runs MODE's tests in its (built) tree, JOBS at a time.
test_mode() {
  settings "$1"
  echo "run-sanitizers: testing ($sanitize)"
  local filter=()
  ((${#skips[@]} == 0)) || filter=(GTEST_FILTER="-$(IFS=:; echo "${skips[*]}")")
  rm -rf "$build/test-results" "$build/Testing/Temporary/LastTestsFailed.log"
  # Reports go to the test's output; the first one ends the process with a failure.
  # shellcheck disable=SC2086
  if ! (cd "$build" && env -u GTEST_FILTER "${filter[@]}" GTEST_OUTPUT="json:$PWD/test-results/" \
          ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1 \
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
          TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:exitcode=66:suppressions=$root/tests/tsan/suppressions.txt" \
          ctest --output-on-failure --parallel "$2" "${select[@]}" ${CTEST_ARGS:-}); then
    echo "run-sanitizers: $sanitize FAILED"
    return 1
  fi
}

configure_only=false
if [[ ${1:-} == --configure ]]; then
  configure_only=true
  modes=("${modes[@]:1}")
  ((${#modes[@]} > 0)) || modes=(address thread)
fi
root=$PWD
for mode in "${modes[@]}"; do settings "$mode"; done  # a bad mode is refused before any work
if $configure_only; then
  for mode in "${modes[@]}"; do configure_mode "$mode"; done
  exit 0
fi
status=0
built=true
build_mode "${modes[0]}" || built=false
for i in "${!modes[@]}"; do
  next=${modes[$((i + 1))]:-}
  if [[ -n $next ]]; then
    settings "$next"
    mkdir -p "$build"
    next_log=$build/build.log
    (renice -n 10 -p "$BASHPID" >/dev/null || true; build_mode "$next") >"$next_log" 2>&1 &
    next_build=$!
  fi
  if $built; then
    jobs=$(nproc)
    [[ -n $next ]] || jobs=$((2 * $(nproc)))  # nothing beside them: two per core
    test_mode "${modes[$i]}" "$jobs" || status=1
  else
    echo "run-sanitizers: building ${modes[$i]} FAILED"
    status=1
  fi
  if [[ -n $next ]]; then
    built=true
    wait "$next_build" || built=false
    cat "$next_log"
  fi
done
exit "$status"
