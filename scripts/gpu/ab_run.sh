#!/usr/bin/env bash
# Runs on the GPU machine: the bench_gpu binaries staged by ab_stage.sh, alternated ROUNDS
# times (greedy decode at BATCHES, default 1; prompt 512, 128 new tokens, 2 repetitions each), then one
# `--trace` run of each (docs/GPU.md: where a layer's time goes). Makes the Llama-3-8B-shape
# BF16 model first if it is not there. Prints one line per run and batch size.
#   ROUNDS=3 BATCHES=1 TRACE=1 bash scripts/gpu/ab_run.sh
# Variants that differ only by environment (A/B knobs read at model load) go in
# .device/ab/VARIANTS, one per line: LABEL BINARY [VAR=VALUE ...]; without that file every
# staged binary runs once per round as it is.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
AB=.device/ab
MODEL=${MODEL:-/tmp/l3-8b-bf16.gguf}
[ -f "$MODEL" ] || timeout 240 "$AB/flashdllm" tools make-model --preset llama3-8b --dtype bf16 -o "$MODEL" | tail -1
[ -f "$AB/REFS" ] && cat "$AB/REFS"
if [ -f "$AB/VARIANTS" ]; then  # comments (#...), blank lines and CRLF endings allowed
  mapfile -t variants < <(sed -e 's/\r$//' -e 's/[[:space:]]*#.*//' "$AB/VARIANTS" | grep -v '^[[:space:]]*$')
elif [ -f "$AB/REFS" ]; then
  mapfile -t variants < <(cut -d: -f1 "$AB/REFS" | awk '{ print $1, $1 }')
else
  variants=()
fi
[ ${#variants[@]} -gt 0 ] || { echo "ab_run.sh: nothing to run (no $AB/VARIANTS or $AB/REFS)" >&2; exit 2; }
for v in "${variants[@]}"; do  # every line checked before the first run: a typo fails now, not as a blank result
  read -r -a f <<<"$v"
  [ ${#f[@]} -ge 2 ] || { echo "ab_run.sh: '$v': want LABEL BINARY [VAR=VALUE ...]" >&2; exit 2; }
  [ -x "$AB/${f[1]}" ] || { echo "ab_run.sh: '$v': $AB/${f[1]} is not an executable" >&2; exit 2; }
  for e in "${f[@]:2}"; do
    [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "ab_run.sh: '$v': '$e' is not VAR=VALUE" >&2; exit 2; }
  done
  echo "variant: $v"
done
bench() {  # bench LABEL BINARY [VAR=VALUE ...] -- bench_gpu flags
  local bin=$2; shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  timeout 90 env ${envs[@]+"${envs[@]}"} "$AB/$bin" -m "$MODEL" "$@" 2>&1
}
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in "${variants[@]}"; do
    read -r -a f <<<"$v"
    bench "${f[@]}" -- --batches "${BATCHES:-1}" --reps 2 | grep -E '^batch' | sed "s/^/== ${f[0]} round $r: /"
  done
done
if [ "${TRACE:-1}" = 1 ]; then
  for v in "${variants[@]}"; do
    read -r -a f <<<"$v"
    echo "== trace ${f[0]}"
    bench "${f[@]}" -- --batches 1 --reps 1 --trace | grep -E "trace|^ +[a-z]"
  done
fi
