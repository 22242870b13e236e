#!/usr/bin/env bash
# Creates the repository's Python environment `.venv` (git-ignored) for the server's
# integration tests (tests/integration/server/*.py), which drive `flashdllm serve` through the
# official `openai` client (it brings `httpx` along) and check structured outputs with
# `jsonschema`.
#
# Idempotent and quick when the environment is already complete: it checks that the packages
# import before touching pip. Needs python3 with the venv module (Debian: python3-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import openai, httpx, jsonschema' 2>/dev/null; then
  exit 0
fi
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'openai>=1.0' httpx jsonschema
"$venv/bin/python" -c 'import openai, httpx, jsonschema; print("python-env: openai", openai.__version__)'
