#!/usr/bin/env python3
"""Quantizes a GGUF model with llama.cpp's own quantizer (what `llama-quantize` runs).

The benchmark models are random-weight F16 files from `flashdllm tools make-model`; the
quantized files people download come from llama.cpp's quantizer, so the side-by-side
benchmarks (bench_vs_llamacpp.py) quantize with it rather than with flashdllm.

Usage (llama.cpp from PyPI: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python):
  python3 bench/llamacpp_quantize.py models/bench-110m-f16.gguf models/bench-110m-Q4_K_M.gguf Q4_K_M
Types: any LLAMA_FTYPE_MOSTLY_<TYPE> that llama-cpp-python exports (Q4_0, Q8_0, Q4_K_M,
Q5_K_M, Q6_K, ...). Exits with 2 on a bad argument, 1 when the quantizer fails.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", type=Path, help="GGUF to quantize (F16, BF16 or F32 weights)")
    ap.add_argument("output", type=Path, help="GGUF to write")
    ap.add_argument("type", help="target type, e.g. Q4_K_M, Q5_K_M, Q8_0")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1, help="quantizer threads")
    args = ap.parse_args(argv)
    try:
        import llama_cpp
    except ImportError:
        print('llamacpp_quantize: llama-cpp-python is not installed (CMAKE_ARGS="-DGGML_NATIVE=ON" '
              "pip install llama-cpp-python)", file=sys.stderr)
        return 2
    ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + args.type.upper(), None)
    if ftype is None:
        known = sorted(n.removeprefix("LLAMA_FTYPE_MOSTLY_") for n in dir(llama_cpp) if n.startswith("LLAMA_FTYPE_MOSTLY_"))
        print(f"llamacpp_quantize: unknown type {args.type!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if not args.input.is_file():
        print(f"llamacpp_quantize: {args.input}: no such file", file=sys.stderr)
        return 2
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = args.threads
    args.output.parent.mkdir(parents=True, exist_ok=True)
    rc = llama_cpp.llama_model_quantize(str(args.input).encode(), str(args.output).encode(), ctypes.byref(params))
    if rc != 0:
        print(f"llamacpp_quantize: llama.cpp's quantizer failed ({rc}) on {args.input}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} ({args.type}, {args.output.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
