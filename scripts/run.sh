#!/usr/bin/env bash
# The main job: install dependencies, build, and generate a story with the default model
# (stories260K). Extra arguments go to `flashdllm generate`, e.g. scripts/run.sh -p "Lily" -n 64.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
echo "flashdllm: building into build/ (the first build takes several minutes on 2 cores)..." >&2
log=$(mktemp); scripts/build.sh >"$log" 2>&1 || { cat "$log" >&2; exit 1; }; rm -f "$log"
has_prompt=0
for a in "$@"; do case "$a" in -p|--prompt|-f|--file) has_prompt=1 ;; esac; done
[ "$has_prompt" = 1 ] || set -- -p "Once upon a time" "$@"
exec build/bin/flashdllm generate "$@"
