# Sourced by the GPU benchmarks of the KV tiers (from the repository root, after stage.sh):
# OUT (results, made), D and the library path (scripts/gpu/device_env.sh), F (the staged
# flashdllm), log, and MODEL: the Llama-3-8B shape in F16 with random weights, made if missing.
OUT=${OUT:-/tmp/fdl-out}
mkdir -p "$OUT"
source scripts/gpu/device_env.sh
F=$D/bin/flashdllm
MODEL=${MODEL:-/tmp/l3-8b-f16.gguf}
log() { echo "[$(date +%T)] $*"; }
if [ ! -f "$MODEL" ]; then
  log "making $MODEL (Llama-3-8B shape, F16, random weights)"
  timeout 300 "$F" tools make-model --preset llama3-8b --dtype f16 -o "$MODEL" | tail -1 || exit 1
fi
