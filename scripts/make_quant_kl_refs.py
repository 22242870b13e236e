#!/usr/bin/env python3
"""llama.cpp's KL divergence of codelm-16m's quantized files from its F16 file, as a test fixture.

For each of the 12 prompts of ../shared/reference/codelm_quant_greedy.json, the token sequence is
the prompt followed by llama.cpp's greedy continuation on the Q8_0 file (both tokenized together
by llama.cpp, BOS first). Every file (F16 and the five llama-quantize files) is run by llama.cpp
(llama-cpp-python's low-level API, CPU) over every sequence with logits at every position; at
each position the next-token distributions give KL(P_F16 || P_file) in float64. The fixture
keeps the ids and, per file, the mean and the 99th percentile over all positions, so a test can
hold flashdllm's divergence from its own F16 run on the same ids to llama.cpp's (tests/engine/
test_quantized_kl.cpp, tests/gpu/cuda_quantized_model_test.cpp).

Usage: python3 scripts/make_quant_kl_refs.py [--shared ../shared] [-o tests/data/codelm_quant_kl.json]
Needs llama-cpp-python (CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python==0.3.36) and numpy.
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FILES = ["codelm-16m-Q4_0.gguf", "codelm-16m-Q4_K_M.gguf", "codelm-16m-Q5_K_M.gguf", "codelm-16m-Q6_K.gguf",
         "codelm-16m-Q8_0.gguf"]


def tokenize(L, vocab, text: str) -> list[int]:
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 8))()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
    if n < 0:
        raise RuntimeError(f"tokenize: {n}")
    return list(buf[:n])


def all_logits(L, model, ids: list[int]) -> np.ndarray:
    """[len(ids)][n_vocab] float32 logits of one sequence in a fresh context, fed one token per
    decode (a batch of one gives its logits without per-token output flags)."""
    cp = L.llama_context_default_params()
    cp.n_ctx = max(64, len(ids) + 8)
    cp.n_threads = cp.n_threads_batch = 2
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    try:
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        one = (L.llama_token * 1)()
        rows = []
        for t in ids:
            one[0] = t
            if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
                raise RuntimeError("llama_decode failed")
            rows.append(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy())
        return np.stack(rows)
    finally:
        L.llama_free(ctx)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=str(REPO.parent / "shared"))
    ap.add_argument("-o", "--output", default=str(REPO / "tests" / "data" / "codelm_quant_kl.json"))
    args = ap.parse_args()
    shared = Path(args.shared)
    import llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, user: None)  # keep a reference
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    ref = json.loads((shared / "reference" / "codelm_quant_greedy.json").read_text())
    cases = [c for c in ref if c["model"] == "codelm-16m-Q8_0.gguf"]
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    models = {f: L.llama_model_load_from_file(str(shared / "models" / f).encode(), mp)
              for f in ["codelm-16m-f16.gguf"] + FILES}
    vocab = L.llama_model_get_vocab(models["codelm-16m-f16.gguf"])
    sequences = [tokenize(L, vocab, c["prompt"] + c["output_text"]) for c in cases]
    base = [log_softmax(all_logits(L, models["codelm-16m-f16.gguf"], ids)) for ids in sequences]
    result = {}
    for f in FILES:
        kl = []
        for ids, lp in zip(sequences, base):
            lq = log_softmax(all_logits(L, models[f], ids))
            kl.extend((np.exp(lp) * (lp - lq)).sum(axis=-1).tolist())
        kl = np.array(kl)
        result[f] = {"mean": float(kl.mean()), "p99": float(np.percentile(kl, 99)), "max": float(kl.max())}
        print(f"{f}: mean KL {kl.mean():.6f}, p99 {np.percentile(kl, 99):.6f} over {len(kl)} positions")
    out = {
        "what": "llama.cpp's KL(P_F16 || P_file) of the next-token distribution at every position of the sequences "
                "(scripts/make_quant_kl_refs.py)",
        "engine": f"llama.cpp via llama-cpp-python {getattr(L, '__version__', '?')} (CPU, GGML_NATIVE): "
                  + L.llama_print_system_info().decode().strip(" |"),
        "base": "codelm-16m-f16.gguf",
        "sequences": sequences,
        "llama_cpp_kl": result,
    }
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.output)


if __name__ == "__main__":
    main()
