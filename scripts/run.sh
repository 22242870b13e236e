#!/usr/bin/env bash
# The main job: install dependencies, build, and generate a story with the default model
# (stories260K). Extra arguments go to `flashdllm generate`, e.g. scripts/run.sh -p "Lily" -n 64.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh >/dev/null
if [ $# -eq 0 ]; then set -- -p "Once upon a time" -n 128; fi
exec build/bin/flashdllm generate "$@"
