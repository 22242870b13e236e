#!/usr/bin/env bash
# CI hardening steps, after the main test run (scripts/test.sh). Both use one build, made once
# in build-ci-asan/: clang, ASan + UBSan, -O1 with line tables (reports name source lines; -O1
# keeps the suites' arithmetic quick), every libFuzzer target and the CPU test suites.
#  fuzz: every libFuzzer target (scripts/fuzz_common.sh) for FUZZ_SECONDS (default 60) from its
#     committed corpus, two at a time; any crash, sanitizer report, leak or slow input fails the
#     step. The mutation seed is fixed (FUZZ_SEED, default 1): CI on a commit tries the same
#     inputs in the same order each time (as many as the time allows), so a finding shows on the
#     commit that brings it, not at random on a later one. scripts/fuzz.sh, for long runs
#     offline, draws a random seed each time.
#  asan: the C++ test suites (labels unit and integration) under the sanitizers; any report
#     fails its test. The Python server suites and the soak are left out: they drive the same C++
#     paths through the CLI, at several times their run time under ASan.
# Usage: scripts/ci_hardening.sh [fuzz|asan]... (both by default). Env: FUZZ_SECONDS, FUZZ_SEED,
# JOBS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/fuzz_common.sh
jobs=${JOBS:-2}
build=$PWD/build-ci-asan

sanitized_build() {
  local flags="-O1 -gline-tables-only"
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" \
    -DFLASHDLLM_SANITIZE=ON -DFLASHDLLM_FUZZ=ON -DFLASHDLLM_CUDA=OFF -DFLASHDLLM_BUILD_BENCH=OFF >/dev/null
  cmake --build "$build" -j "$jobs"
}

fuzz_all() {
  local seconds=${FUZZ_SECONDS:-60}
  local work=$build/fuzz-runs
  rm -rf "$work"
  local failed=() i t
  # Two fuzzers at a time, one per core: each is single-threaded.
  for ((i = 0; i < ${#FUZZ_TARGETS[@]}; i += 2)); do
    local pids=() names=("${FUZZ_TARGETS[@]:i:2}")
    for t in "${names[@]}"; do
      fuzz_run "$build" "$t" "$seconds" "$work" -seed="${FUZZ_SEED:-1}" &
      pids+=($!)
    done
    for ((j = 0; j < ${#pids[@]}; ++j)); do
      t=${names[j]}
      if wait "${pids[j]}"; then
        echo "fuzz $t: $(grep -m1 -o 'Done [0-9]* runs in [0-9]* second(s)' "$work/$t.log")"
      else
        failed+=("$t")
        echo "fuzz $t FAILED; the end of its log ($work/$t.log):" >&2
        tail -n 60 "$work/$t.log" >&2
      fi
    done
  done
  if ((${#failed[@]})); then
    echo "fuzz targets failed: ${failed[*]} (inputs in $work/artifacts/)" >&2
    return 1
  fi
}

asan_tests() {
  # detect_leaks: a leak fails the test like any other report. Left out: the Python suites
  # (server_py_*), the soak and the virtual environment they set up.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900 -LE gpu \
    -E '^(server_py_.*|server_python_env|soak_short)$'
}

steps=("$@")
((${#steps[@]})) || steps=(fuzz asan)
for step in "${steps[@]}"; do
  [[ $step == fuzz || $step == asan ]] || { echo "usage: $0 [fuzz|asan]..." >&2; exit 2; }
done
start=$SECONDS
sanitized_build
echo "ci_hardening: the sanitized build took $((SECONDS - start)) s"
# Every step runs, whether or not an earlier one failed, so one CI run reports them all.
failed=()
for step in "${steps[@]}"; do
  start=$SECONDS
  status=0
  case "$step" in
    fuzz) fuzz_all || status=$? ;;
    asan) asan_tests || status=$? ;;
  esac
  echo "ci_hardening: $step took $((SECONDS - start)) s$( ((status)) && echo ", FAILED")"
  ((status == 0)) || failed+=("$step")
done
if ((${#failed[@]})); then
  echo "ci_hardening: failed: ${failed[*]}" >&2
  exit 1
fi
