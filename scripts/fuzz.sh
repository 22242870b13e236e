#!/usr/bin/env bash
# Build a parser's libFuzzer target with clang (ASan + UBSan) and run it.
#
#   scripts/fuzz.sh gguf|safetensors|hfconfig|jinja|grammar|request [SECONDS] [extra libFuzzer flags...]
#
# SECONDS defaults to 60. Env: BUILD_DIR (default build-fuzz), JOBS (build parallelism, 2).
# The corpus grows in fuzz/corpus-run/<target> (git-ignored) and is reused by later runs. Seeds
# come in each time (scripts/fuzz_common.sh): for gguf, small valid files made by
# gguf_fuzz_seeds plus the committed regression inputs in fuzz/corpus/; for safetensors, the
# committed fuzz/corpus-safetensors/; for hfconfig (config.json, optionally "\n---\n" and
# tokenizer.json), fuzz/corpus-hfconfig/; for jinja (a chat template's source),
# fuzz/corpus-jinja/; for grammar (GBNF text, or a JSON schema), fuzz/corpus-grammar/; for
# request (an endpoint digit, then an HTTP request body), fuzz/corpus-request/.
# The dictionaries (fuzz/<target>.dict) hold each format's keys. The log is
# fuzz/corpus-run/<target>.log; crashes land in fuzz/corpus-run/artifacts/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/fuzz_common.sh"

target=${1:-}
if ! fuzz_binary "$target" >/dev/null; then
  echo "usage: $0 $(IFS='|'; echo "${FUZZ_TARGETS[*]}") [SECONDS] [libFuzzer flags...]" >&2
  exit 2
fi
shift
seconds=${1:-60}
shift || true
build=${BUILD_DIR:-$FUZZ_ROOT/build-fuzz}
run=$FUZZ_ROOT/fuzz/corpus-run

fuzz_build "$build" "$target"
status=0
fuzz_run "$build" "$target" "$seconds" "$run" "$@" || status=$?
tail -n 30 "$run/$target.log"
exit "$status"
