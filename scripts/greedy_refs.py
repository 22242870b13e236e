#!/usr/bin/env python3
"""Greedy ids of `flashdllm generate` for every reference prompt, on one device.

Runs the CLI once per case of ../shared/reference/{stories260K,codelm}_greedy.json (the
prompt text, BOS as the reference says, temperature 0, n_predict tokens, EOS ignored) and
writes one JSON line per case: file, index, whether the prompt tokenized to the reference's
ids, and the generated ids. Compare two devices' files with --compare A B: every case's
ids must be equal (the CUDA backend's promise: greedy ids equal the CPU backend's for all
reference prompts), and the first step where each differs from the reference is
printed next to the reference's own near-tie step (its argmin_margin_step).

  python3 scripts/greedy_refs.py --device cpu  -o cpu.jsonl
  python3 scripts/greedy_refs.py --device cuda -o cuda.jsonl   # on the GPU machine
  python3 scripts/greedy_refs.py --compare cpu.jsonl cuda.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = [("stories260K_greedy.json", "stories260K.gguf"), ("codelm_greedy.json", "codelm-16m-f16.gguf")]


def shared_dir() -> Path:
    return Path(os.environ.get("FLASHDLLM_SHARED", REPO.parent / "shared"))


def first_difference(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run(args: argparse.Namespace) -> int:
    if not os.access(args.flashdllm, os.X_OK):
        print(f"greedy_refs.py: {args.flashdllm} is not an executable (build it, or pass --flashdllm)", file=sys.stderr)
        return 2
    out = open(args.output, "w") if args.output else sys.stdout
    for ref_file, model in CASES:
        cases = json.loads((shared_dir() / "reference" / ref_file).read_text())
        for i, case in enumerate(cases):
            cmd = [args.flashdllm, "generate", "-m", str(shared_dir() / "models" / model), "-p", case["prompt"],
                   "--temp", "0", "-n", str(case["n_predict"]), "--ignore-eos", "--json", "--device", args.device]
            if not case["add_bos"]:
                cmd.append("--no-bos")
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if res.returncode != 0:
                print(f"{ref_file}#{i}: flashdllm failed ({res.returncode}): {res.stderr.strip()[-300:]}", file=sys.stderr)
                return 1
            got = json.loads(res.stdout)
            line = {"file": ref_file, "index": i, "prompt_ids_match": got["prompt_token_ids"] == case["prompt_token_ids"],
                    "ids": got["token_ids"]}
            out.write(json.dumps(line) + "\n")
            out.flush()
    return 0


def compare(a_path: str, b_path: str) -> int:
    try:
        a = [json.loads(l) for l in open(a_path)]
        b = [json.loads(l) for l in open(b_path)]
    except (OSError, json.JSONDecodeError) as e:
        print(f"greedy_refs.py: cannot read the files to compare: {e}", file=sys.stderr)
        return 2
    refs = {f: json.loads((shared_dir() / "reference" / f).read_text()) for f, _ in CASES}
    for x in a + b:
        ok = isinstance(x, dict) and x.get("file") in refs and isinstance(x.get("index"), int)
        if not (ok and 0 <= x["index"] < len(refs[x["file"]]) and isinstance(x.get("ids"), list)
                and "prompt_ids_match" in x):
            print(f"greedy_refs.py: not a line this script writes: {json.dumps(x)[:120]}", file=sys.stderr)
            return 2
    if [(x["file"], x["index"]) for x in a] != [(x["file"], x["index"]) for x in b]:
        print("greedy_refs.py: the two files hold different cases", file=sys.stderr)
        return 2
    if not a:
        print("greedy_refs.py: no cases to compare", file=sys.stderr)
        return 2
    bad = 0
    for x, y in zip(a, b):
        ref = refs[x["file"]][x["index"]]
        same = x["ids"] == y["ids"]
        bad += 0 if same and x["prompt_ids_match"] and y["prompt_ids_match"] else 1
        print(f"{x['file']}#{x['index']}: {'equal' if same else 'DIFFER at ' + str(first_difference(x['ids'], y['ids']))}"
              f" ({len(x['ids'])} ids); vs reference: first difference {first_difference(x['ids'], ref['output_token_ids'])}"
              f" / {first_difference(y['ids'], ref['output_token_ids'])}, reference near-tie step"
              f" {ref.get('argmin_margin_step')} (margin {ref.get('min_top1_top2_logit_margin')})"
              + ("" if x["prompt_ids_match"] and y["prompt_ids_match"] else "; PROMPT IDS DIFFER"))
    print(f"{len(a) - bad} of {len(a)} cases equal")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--flashdllm", default=str(REPO / "build" / "bin" / "flashdllm"))
    p.add_argument("-o", "--output")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = p.parse_args()
    return compare(*args.compare) if args.compare else run(args)


if __name__ == "__main__":
    sys.exit(main())
