#!/usr/bin/env bash
# The test job: install dependencies, build, run every CTest suite (labels unit, integration;
# gpu tests are skipped on machines without a GPU; the module include graph is checked for
# cycles first), then run the README's CLI quick tour
# against the build (scripts/check_tour.sh; loopback only, a few seconds), then the sanitized
# build: every fuzz target for a minute and the C++ suites under ASan + UBSan
# (scripts/ci_hardening.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
python3 scripts/check_module_cycles.py  # the modules under src/ include each other one way only
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 300 "$@"
BUILD=build bash scripts/check_tour.sh
scripts/ci_hardening.sh
