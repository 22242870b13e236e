#!/usr/bin/env bash
# Build a parser's libFuzzer target with clang (ASan + UBSan) and run it.
#
#   scripts/fuzz.sh gguf|safetensors|hfconfig|jinja|grammar [SECONDS] [extra libFuzzer flags...]
#
# SECONDS defaults to 60. Env: BUILD_DIR (default build-fuzz), JOBS (build parallelism, 2).
# The corpus grows in fuzz/corpus-run/<target> (git-ignored) and is reused by later runs. Seeds
# come in each time: for gguf, small valid files made by gguf_fuzz_seeds plus the committed
# regression inputs in fuzz/corpus/; for safetensors, the committed fuzz/corpus-safetensors/; for
# hfconfig (config.json, optionally "\n---\n" and tokenizer.json), fuzz/corpus-hfconfig/; for jinja
# (a chat template's source), fuzz/corpus-jinja/; for grammar (GBNF text, or a JSON schema),
# fuzz/corpus-grammar/.
# The dictionaries (fuzz/<target>.dict) hold each format's keys. Crashes land in
# fuzz/corpus-run/artifacts/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${1:-}
case "$target" in
  gguf) build_targets=(gguf_fuzz gguf_fuzz_seeds) ;;
  safetensors) build_targets=(safetensors_fuzz) ;;
  hfconfig) build_targets=(hf_config_fuzz) ;;
  jinja) build_targets=(jinja_fuzz) ;;
  grammar) build_targets=(grammar_fuzz) ;;
  *) echo "usage: $0 gguf|safetensors|hfconfig|jinja|grammar [SECONDS] [libFuzzer flags...]" >&2; exit 2 ;;
esac
shift
build=${BUILD_DIR:-$root/build-fuzz}
seconds=${1:-60}
shift || true

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLASHDLLM_FUZZ=ON -DFLASHDLLM_BUILD_TESTS=OFF -DFLASHDLLM_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target "${build_targets[@]}" -j "${JOBS:-2}"

run=$root/fuzz/corpus-run
mkdir -p "$run/$target" "$run/artifacts"
if [ "$target" = gguf ]; then
  "$build/bin/gguf_fuzz_seeds" "$run/gguf"
  cp "$root"/fuzz/corpus/* "$run/gguf/"  # inputs that once found bugs
else
  cp "$root"/fuzz/corpus-$target/* "$run/$target/"
fi

cd "$run"
# -jobs=1 runs one fuzzing worker in the background and logs to fuzz-0.log; the log is printed
# at the end. rss_limit bounds memory per input: the readers must stay O(file size).
status=0
binary=${build_targets[0]}
dict=()
[ -f "$root/fuzz/$target.dict" ] && dict=(-dict="$root/fuzz/$target.dict")
"$build/bin/$binary" "$run/$target" "${dict[@]}" -max_len=65536 \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -jobs=1 \
  -artifact_prefix="$run/artifacts/" "$@" || status=$?
tail -n 30 "$run/fuzz-0.log" 2>/dev/null || true
exit "$status"
