#!/usr/bin/env python3
"""HF Transformers peer for the CUDA benchmark (run on the GPU machine, same run as bench_gpu).

Builds LlamaForCausalLM from a LlamaConfig of the Llama-3-8B shape with random bf16 weights
(no download), then times greedy generate() on random prompt ids:
  TTFT       = generate(max_new_tokens=1) wall time (prompt in, first token out), batch 1;
  decode     = B * (gen - 1) / (t(gen tokens) - t(1 token)) tokens per second;
for the default (dynamic) cache and cache_implementation="static" (which transformers may
compile on first use: the untimed warm-up runs both timed lengths twice to absorb that).
Each number is the median of --reps.

  python3 bench/gpu/hf_peer.py --prompt 512 --gen 128 --batches 1,64 --modes dynamic,static --json hf.json
"""
import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = LlamaForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    return model.eval()


def timed_generate(model, ids, n_new, mode):
    kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0)
    if mode == "static":
        kw["cache_implementation"] = "static"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, **kw)
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + n_new, out.shape
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--modes", default="dynamic,static")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    t0 = time.perf_counter()
    model = build_model()
    print(f"model built in {time.perf_counter() - t0:.1f} s")
    g = torch.Generator(device="cuda").manual_seed(42)
    results = []
    for mode in a.modes.split(","):
        for b in [int(x) for x in a.batches.split(",")]:
            ids = torch.randint(1, 128256, (b, a.prompt), device="cuda", generator=g)
            try:
                # Warm up both lengths that are timed: with the static cache each max_new_tokens
                # is its own cache shape, which torch.compile compiles once.
                t = time.perf_counter()
                for n_new in (1, a.gen, 1, a.gen):
                    timed_generate(model, ids, n_new, mode)
                warm = time.perf_counter() - t
                ttft, full = [], []
                for _ in range(a.reps):
                    ttft.append(timed_generate(model, ids, 1, mode))
                    full.append(timed_generate(model, ids, a.gen, mode))
                t1, tf = statistics.median(ttft), statistics.median(full)
                tps = b * (a.gen - 1) / (tf - t1)
                r = dict(mode=mode, batch=b, ttft_ms=t1 * 1e3, decode_tok_s=tps, total_s=tf, warmup_s=warm)
            except Exception as e:  # report and go on with the other configurations
                r = dict(mode=mode, batch=b, error=f"{type(e).__name__}: {e}"[:300])
            print(json.dumps(r), flush=True)
            results.append(r)
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(torch=torch.__version__, transformers=transformers.__version__, prompt=a.prompt,
                           gen=a.gen, results=results), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
