# Sourced by the scripts that run on the GPU machine (after stage.sh): D (the staged folder),
# the library path for the staged shared libraries and the toolkit's, and cuBLAS where the
# machine keeps it outside the default path.
D=$PWD/.device
export LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ldd "$D/bin/flashdllm" | grep -q "libcublas.*not found"; then
  cublas=$(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -1)
  [ -n "$cublas" ] && export LD_LIBRARY_PATH=$(dirname "$cublas"):$LD_LIBRARY_PATH
fi
