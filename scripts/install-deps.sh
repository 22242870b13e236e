#!/usr/bin/env bash
# Installs the Debian 12 packages flashdllm builds and tests with. Idempotent: packages that
# are already present are skipped, so a warm machine pays nothing.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git python3
      libgtest-dev libgmock-dev libbenchmark-dev
      libpcre2-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libxxhash-dev
      libcpp-httplib-dev liburing-dev libhiredis-dev libopenblas-dev
      redis-server python3-venv
      clang libclang-rt-dev llvm)  # libFuzzer and the sanitizers' runtimes; llvm-symbolizer for their reports
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
