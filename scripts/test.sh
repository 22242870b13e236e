#!/usr/bin/env bash
# The test job: install dependencies, build, run every CTest suite (labels unit, integration;
# gpu tests are skipped on machines without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 300 "$@"
