#!/usr/bin/env python3
"""Writes tests/data/quant_blocks.json: random blocks of every block-quantized type flashdllm
computes with, and their values as llama.cpp's gguf-py (the `gguf` package on PyPI) dequantizes
them, an outside oracle for src/core/quant_blocks.cpp.

usage: pip install gguf numpy && python3 scripts/make_quant_block_fixture.py [OUT.json]

Block bytes are random except the fp16 scale fields, which get finite values of a weight's
magnitude (a random fp16 there is often Inf or NaN)."""
import json
import sys

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

# Byte offsets of each type's fp16 fields (d, and m / dmin where the type has one).
HALF_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}
BLOCKS = 3

def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant_blocks.json"
    rng = np.random.default_rng(20261204)
    cases = []
    for name, fields in HALF_FIELDS.items():
        qt = GGMLQuantizationType[name]
        block, size = GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
        for b in range(BLOCKS):
            for off in fields:
                raw[b, off:off + 2] = np.frombuffer(np.float16(rng.uniform(-0.05, 0.05)).tobytes(), np.uint8)
        values = quants.dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert values.size == BLOCKS * block and np.all(np.isfinite(values))
        cases.append({"type": name, "blocks": BLOCKS, "hex": raw.tobytes().hex(),
                      "values_f32_hex": values.astype("<f4").tobytes().hex()})
    json.dump({"generator": "scripts/make_quant_block_fixture.py (gguf-py quants.dequantize)", "cases": cases},
              open(out_path, "w"), indent=0)
    print(len(cases), "types ->", out_path)

main()
