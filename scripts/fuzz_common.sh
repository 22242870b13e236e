# Shared by scripts/fuzz.sh (one target, offline) and scripts/ci_hardening.sh (every target, in
# CI): which targets exist, where their seeds come from and how libFuzzer is run on them, and the
# offline build (fuzz_build; CI builds the targets with its sanitized test build instead, at -O1
# with asserts on). Source it; it defines functions and FUZZ_TARGETS only.

FUZZ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ_TARGETS=(gguf safetensors hfconfig jinja grammar request)

# The fuzzer executable of a target.
fuzz_binary() {
  case "$1" in
    gguf) echo gguf_fuzz ;;
    safetensors) echo safetensors_fuzz ;;
    hfconfig) echo hf_config_fuzz ;;
    jinja) echo jinja_fuzz ;;
    grammar) echo grammar_fuzz ;;
    request) echo request_fuzz ;;
    *) return 1 ;;
  esac
}

# fuzz_build BUILD_DIR TARGET...: configures BUILD_DIR (clang, ASan + UBSan, no tests, benches
# or CUDA) and builds the targets' fuzzers (gguf also needs its seed maker).
fuzz_build() {
  local build=$1; shift
  local bins=() t
  for t in "$@"; do
    bins+=("$(fuzz_binary "$t")") || { echo "unknown fuzz target '$t'" >&2; return 2; }
    [ "$t" = gguf ] && bins+=(gguf_fuzz_seeds)
  done
  CC=clang CXX=clang++ cmake -S "$FUZZ_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFLASHDLLM_FUZZ=ON -DFLASHDLLM_BUILD_TESTS=OFF -DFLASHDLLM_BUILD_BENCH=OFF -DFLASHDLLM_CUDA=OFF >/dev/null
  cmake --build "$build" --target "${bins[@]}" -j "${JOBS:-2}"
}

# fuzz_seed BUILD_DIR TARGET CORPUS_DIR: puts the target's seeds into CORPUS_DIR. gguf: small
# valid files made by gguf_fuzz_seeds plus the inputs that once found bugs (fuzz/corpus/);
# every other target: its committed fuzz/corpus-TARGET/.
fuzz_seed() {
  local build=$1 target=$2 corpus=$3
  mkdir -p "$corpus"
  if [ "$target" = gguf ]; then
    "$build/bin/gguf_fuzz_seeds" "$corpus"
    cp "$FUZZ_ROOT"/fuzz/corpus/* "$corpus/"
  else
    cp "$FUZZ_ROOT"/fuzz/corpus-"$target"/* "$corpus/"
  fi
}

# fuzz_run BUILD_DIR TARGET SECONDS WORK_DIR [libFuzzer flags...]: seeds WORK_DIR/TARGET and
# fuzzes it for SECONDS; the log goes to WORK_DIR/TARGET.log, crashes to WORK_DIR/artifacts/.
# Returns libFuzzer's status: non-zero for a crash, sanitizer report, leak, timeout (an input
# slower than 10 s) or out-of-memory (the readers must stay O(input size), so 2 GiB is plenty).
fuzz_run() {
  local build=$1 target=$2 seconds=$3 work=$4; shift 4
  local dict=()
  fuzz_seed "$build" "$target" "$work/$target"
  mkdir -p "$work/artifacts"
  [ -f "$FUZZ_ROOT/fuzz/$target.dict" ] && dict=(-dict="$FUZZ_ROOT/fuzz/$target.dict")
  "$build/bin/$(fuzz_binary "$target")" "$work/$target" "${dict[@]}" -max_len=65536 \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/$target-" "$@" >"$work/$target.log" 2>&1
}
