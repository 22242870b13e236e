#!/usr/bin/env bash
# Sourced by stage.sh and ab_stage.sh: copy_device_libs DIR copies into DIR the shared
# libraries the binaries built here link that the GPU machine's image (Ubuntu 24.04, no
# Debian -dev packages) lacks: Debian 12 builds, found through ldconfig.
copy_device_libs() {
  local dir=$1 lib path
  mkdir -p "$dir"
  for lib in liburing.so.2 libspdlog.so.1.10 libfmt.so.9 libhiredis.so.0.14 libcpp-httplib.so.0.11 \
             libpcre2-8.so.0 libxxhash.so.0 libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1; do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !found { print $NF; found = 1 }')  # no early exit: SIGPIPE + pipefail
    [ -n "$path" ] && cp -L "$path" "$dir/"
  done
  return 0
}
