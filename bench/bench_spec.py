#!/usr/bin/env python3
"""Self-verifying speculative decoding vs plain decoding, on CPU.

For each model and prompt, `flashdllm generate --json --temp 0 --ignore-eos -n N -t T` runs
with --spec off, lookup, lookahead and auto — each speculative mode with tree verification
on and off (`--spec-tree`; `--tree on|off` keeps one) — interleaved round by round (so slow
drift of a shared machine hits every mode alike). Reported per (model, workload, mode): median decode
tok/s over prompts x rounds, the median per-prompt speedup over --spec off (same prompt, same
round), tokens per forward and mean accepted length. Every speculative run must reproduce the
plain greedy ids exactly; the script fails otherwise.

Workloads:
  grounded - the prompt holds a story or code passage and starts repeating it (continue /
             repeat / edit a given text): what prompt lookup is made for;
  free     - open-ended generation from a short opening.

With --llamacpp, llama.cpp's own prompt-lookup decoding (llama-cpp-python's
LlamaPromptLookupDecoding through the high-level API) runs on the same prompts, with and
without the draft, after the flashdllm rounds (not interleaved: one llama.cpp model load per
model). Its decode tok/s = (N - 1) / (time(N tokens) - time(1 token)), so prefill is excluded.

Several --cli binaries (a before/after comparison) run interleaved too: within each prompt,
every binary runs every mode before the next prompt, each speedup is against the same
binary's --spec off run of that prompt and round, and all must produce the same greedy ids.

Usage (repository root, after building build/bin/flashdllm):
  python3 bench/bench_spec.py --rounds 5 --json bench/out/spec.json --markdown /tmp/spec.md
  python3 bench/bench_spec.py --cli build-before/bin/flashdllm --cli build/bin/flashdllm --models stories260K
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
MODES = ["off", "lookup", "lookahead", "auto"]

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
         "the park. One day, she saw a big, red ball. She wanted to play with it, but it was too "
         "high.\n")
STORY2 = ("Once upon a time, there was a kind old man named Sam. Sam had a big garden with many "
          "flowers and a tall tree. Every morning, he would water the flowers and sing a happy "
          "song.\n")
CODE = ('def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n\n\n'
        'def mul(a, b):\n    """Return the product of a and b."""\n    return a * b\n\n\n'
        'def sub(a, b):\n    """Return the difference of a and b."""\n    return a - b\n\n\n')
CLASS = ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
         "    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n\n"
         "    def __repr__(self):\n        return f\"Point({self.x}, {self.y})\"\n\n\n")

MODELS = {
    "stories260K": {
        "path": SHARED / "models" / "stories260K.gguf",
        "n": 512,  # ~15 ms per run: shorter runs drown in scheduler noise on a shared box
        "grounded": [STORY + STORY[:60], STORY2 + STORY2[:70],
                     "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had"],
        "free": ["Once upon a time", "One day, a little boy"],
    },
    "codelm-16m": {
        "path": SHARED / "models" / "codelm-16m-f16.gguf",
        "n": 128,
        "grounded": [CODE + "def add(a, b):\n", CLASS + "class Point3:\n    def __init__(self, x, y, z):\n",
                     CODE + CODE[:40]],
        "free": ["import numpy as np\n", "def fibonacci(n):\n"],
    },
}


def find_cli(explicit: str | None) -> Path:
    for p in ([Path(explicit)] if explicit else []) + [REPO / "build" / "bin" / "flashdllm"]:
        if p.exists():
            return p
    sys.exit("flashdllm binary not found; build it or pass --cli")


def run_flashdllm(cli: Path, model: Path, prompt: str, n: int, mode: str, threads: int,
                  window: int, tree: str) -> dict:
    cmd = [str(cli), "generate", "-m", str(model), "-p", prompt, "-n", str(n), "--temp", "0",
           "--ignore-eos", "-t", str(threads), "--spec", mode, "--spec-window", str(window),
           "--spec-tree", tree, "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def llamacpp_rates(model: Path, prompts: list[str], n: int, threads: int, rounds: int) -> dict:
    """Median decode tok/s of llama.cpp, plain and with LlamaPromptLookupDecoding."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    out = {}
    for label, draft in (("plain", None), ("lookup", LlamaPromptLookupDecoding(num_pred_tokens=5))):
        llm = Llama(str(model), n_threads=threads, n_ctx=0, verbose=False, draft_model=draft)  # 0 = the model's context
        rates = []
        for _ in range(rounds):
            for p in prompts:
                t0 = time.perf_counter()
                llm.create_completion(p, max_tokens=1, temperature=0.0)
                t1 = time.perf_counter()
                res = llm.create_completion(p, max_tokens=n, temperature=0.0)
                t2 = time.perf_counter()
                # The high-level API has no ignore-eos: count what it really generated.
                made = res["usage"]["completion_tokens"]
                decode = (t2 - t1) - (t1 - t0)
                if decode > 0 and made > 1:
                    rates.append((made - 1) / decode)
        out[label] = statistics.median(rates) if rates else None
        del llm
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", action="append", help="flashdllm binary; repeat to compare binaries, interleaved")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tree", choices=["both", "on", "off"], default="both",
                    help="tree verification of the speculative modes (--spec-tree): both = each mode twice")
    ap.add_argument("--llamacpp", action="store_true", help="also run llama.cpp prompt lookup")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    clis = [find_cli(c) for c in (args.cli or [None])]
    trees = ["on", "off"] if args.tree == "both" else [args.tree]
    variants = [("off", "off")] + [(m, t) for m in MODES[1:] for t in trees]

    runs = []  # one record per flashdllm run
    for rnd in range(args.rounds):
        for name in args.models.split(","):
            cfg = MODELS[name]
            for workload in ("grounded", "free"):
                for pi, prompt in enumerate(cfg[workload]):
                    plain_ids = None
                    for ci, cli in enumerate(clis):
                        for mode, tree in variants:
                            j = run_flashdllm(cli, cfg["path"], prompt, cfg["n"], mode, args.threads, args.window,
                                              tree)
                            if plain_ids is None and mode == "off":
                                plain_ids = j["token_ids"]
                            elif j["token_ids"] != plain_ids:
                                sys.exit(f"{cli}: {name} {workload} #{pi} --spec {mode} --spec-tree {tree}: "
                                         "ids differ from plain")
                            runs.append({"cli": ci, "round": rnd, "model": name, "workload": workload, "prompt": pi,
                                         "mode": mode, "tree": tree, "tok_s": j["timings"]["decode_tok_s"],
                                         "tree_steps": j["spec"]["tree_steps"],
                                         "tree_alt_accepted": j["spec"]["tree_alt_accepted"],
                                         "tokens_per_forward": j["spec"]["tokens_per_forward"],
                                         "mean_accepted_length": j["spec"]["mean_accepted_length"],
                                         "breaker_open": j["spec"]["breaker_open"]})
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)

    rows = []
    for ci in range(len(clis)):
        for name in args.models.split(","):
            for workload in ("grounded", "free"):
                sel = [r for r in runs if r["cli"] == ci and r["model"] == name and r["workload"] == workload]
                base = {(r["round"], r["prompt"]): r["tok_s"] for r in sel if r["mode"] == "off"}
                for mode, tree in variants:
                    mine = [r for r in sel if r["mode"] == mode and r["tree"] == tree]
                    speedups = [r["tok_s"] / base[(r["round"], r["prompt"])] for r in mine]
                    rows.append({"cli": ci, "model": name, "workload": workload, "mode": mode,
                                 "tree": tree if mode != "off" else "-",
                                 "tok_s": statistics.median(r["tok_s"] for r in mine),
                                 "speedup": statistics.median(speedups),
                                 "min_prompt_speedup": min(
                                     statistics.median(s for r, s in zip(mine, speedups) if r["prompt"] == p)
                                     for p in {r["prompt"] for r in mine}),
                                 "tokens_per_forward": statistics.median(r["tokens_per_forward"] for r in mine),
                                 "mean_accepted_length": statistics.median(r["mean_accepted_length"] for r in mine),
                                 "tree_steps": statistics.median(r["tree_steps"] for r in mine),
                                 "tree_alt_accepted": statistics.median(r["tree_alt_accepted"] for r in mine),
                                 "breaker_opened": sum(r["breaker_open"] for r in mine)})

    if args.json:  # saved now too, so a llama.cpp failure cannot lose these runs
        Path(args.json).write_text(json.dumps({"runs": runs, "rows": rows}, indent=1))
    llama = {}
    if args.llamacpp:
        for name in args.models.split(","):
            cfg = MODELS[name]
            for workload in ("grounded", "free"):
                try:
                    llama[(name, workload)] = llamacpp_rates(cfg["path"], cfg[workload], cfg["n"],
                                                             args.threads, max(1, args.rounds // 3))
                except Exception as e:  # report, do not hide
                    llama[(name, workload)] = {"error": str(e)}

    load = os.getloadavg()[0]
    names = [str(c.relative_to(REPO) if c.is_relative_to(REPO) else c) for c in clis]
    many = len(clis) > 1  # a "binary" column then
    lines = [f"flashdllm {' vs '.join(names)}{' (interleaved)' if many else ''}, "
             f"{args.threads} thread(s), window {args.window}, --tree {args.tree}, {args.rounds} rounds, "
             f"load average {load:.1f} at the end, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             "",
             ("| binary " if many else "") +
             "| model | workload | --spec | --spec-tree | decode tok/s (median) | speedup vs off (median) | worst prompt | tokens/forward | mean accepted length | tree steps | accepted off branch 1 | breaker opened |",
             ("|---" if many else "") + "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append((f"| {names[r['cli']]} " if many else "") + f"| {r['model']} | {r['workload']} | {r['mode']} | {r['tree']} | {r['tok_s']:.0f} | "
                     f"{r['speedup']:.2f}x | {r['min_prompt_speedup']:.2f}x | {r['tokens_per_forward']:.2f} | "
                     f"{r['mean_accepted_length']:.2f} | {r['tree_steps']:.0f} | {r['tree_alt_accepted']:.0f} | "
                     f"{r['breaker_opened']} |")
    if llama:
        lines += ["", "| model | workload | llama.cpp plain tok/s | llama.cpp prompt-lookup tok/s | ratio |",
                  "|---|---|---:|---:|---:|"]
        for (name, workload), v in llama.items():
            if "error" in v or v["plain"] is None or v["lookup"] is None:
                lines.append(f"| {name} | {workload} | not measured: {v.get('error', 'no usable run')} | | |")
            else:
                lines.append(f"| {name} | {workload} | {v['plain']:.0f} | {v['lookup']:.0f} | "
                             f"{v['lookup'] / v['plain']:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "rows": rows,
                                               "llamacpp": {f"{k[0]}/{k[1]}": v for k, v in llama.items()}},
                                              indent=1))


if __name__ == "__main__":
    main()
