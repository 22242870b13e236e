#!/usr/bin/env python3
"""How far draft-free speculation could go: zero-cost and cost-aware ceilings.

What is measured. For each model, workload (grounded, free) and prompt of bench/bench_spec.py
(its MODELS dict), plain greedy decoding runs once (`flashdllm generate --temp 0 --ignore-eos
--spec off --json`); its token ids are the ground truth every lossless greedy scheme must
reproduce. At every decode step (context = prompt + tokens so far, ending with the token
being fed), an oracle drafts from the context and a draft token counts as accepted iff it
equals the next plain token; the forward then yields the accepted prefix plus one token.
Verification is taken to be free and exact, so the figures ignore everything that makes real
speculation cost something:

  prompt lookup   the drafter of src/decode/prompt_lookup.cpp (longest suffix of n_min..n_max
                  = 1..4 tokens that occurred earlier, its most recent occurrence, up to k of
                  the tokens that followed, never past the end of the context), speculating at
                  every step with window k;
  any candidate   the best continuation among ALL earlier occurrences of the last token
                  (every match of the last 1..4 tokens ends at one of them), a copy that may
                  run on into the tokens it has just proposed; what an unlimited token tree
                  over context n-grams could accept at best;
  any chain       every drafted token only has to have followed its predecessor somewhere
                  earlier (in the context or the accepted drafts): the union of all drafts
                  that chain 1-gram lookups, as the engine's n-gram cache extends a short
                  prompt-lookup draft; the most generous of the three.

All three give tokens per forward (decode tokens / decode forwards) for windows k = 1..64.

The cost-aware ceiling prices each forward with this engine's measured forward time:
`bench_spec_step_cost` at a few contexts spanning the runs (1..16 tokens per forward, plus 32
and 64 tokens measured separately and scaled to the 1-token time of the main run),
interpolated linearly in tokens and in context. A perfect-foresight oracle knows how many
drafts each step will accept and verifies only those: a step that emits m tokens costs
C(m, context), and the cheapest way to emit the whole plain output is found by dynamic
programming (from each position any m up to accepted + 1 tokens). Plain decoding costs
C(1, context) per token. With the any-chain acceptance, the ratio is an upper bound on the
speedup of any lossless draft-free scheme built on context n-grams at these forward costs:
no such scheme accepts more, none pays less than the forward of the tokens it keeps, and
drafting, rejected rows, control and noise are all free here. "Best fixed window" is the
any-candidate and prompt-lookup acceptance without foresight of the length: each step with a
candidate verifies k drafts (fewer near the end of the run; prompt lookup: its draft's
length), the best k reported.

Usage (repository root, after building build/bin/flashdllm and build/bin/bench_spec_step_cost):
  python3 bench/spec_ceiling.py -t 2 --markdown /tmp/ceiling.md --json bench/out/ceiling.json
  python3 bench/spec_ceiling.py --models stories260K --contexts 100,300,600
  python3 bench/spec_ceiling.py --costs bench/out/ceiling.json   # new oracles, same measured costs
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec import MODELS, REPO  # noqa: E402  (the prompts live there, once)

WINDOWS = [1, 2, 3, 5, 8, 16, 64]
NGRAM_MIN, NGRAM_MAX = 1, 4  # SpecOptions defaults (include/flashdllm/speculative.h)
MAIN_MAX_TOKENS = 16         # forward sizes 1..16 timed in one run of bench_spec_step_cost
EXTRA_TOKENS = [32, 64]      # timed separately (with their own 1-token reference)


# ---------------------------------------------------------------- plain decoding (ground truth)

def plain_run(cli: Path, model: Path, prompt: str, n: int, threads: int) -> tuple[list[int], list[int]]:
    """Prompt ids and generated ids of plain greedy decoding."""
    cmd = [str(cli), "generate", "-m", str(model), "-p", prompt, "-n", str(n), "--temp", "0",
           "--ignore-eos", "-t", str(threads), "--spec", "off", "--json"]
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if len(j["token_ids"]) != n:
        sys.exit(f"{model.name}: expected {n} generated tokens, got {len(j['token_ids'])}")
    return j["prompt_token_ids"], j["token_ids"]


# ---------------------------------------------------------------- drafting oracles

def prompt_lookup_draft(ctx: list[int], max_tokens: int) -> list[int]:
    """src/decode/prompt_lookup.cpp PromptLookup::propose: the longest suffix of NGRAM_MIN..
    NGRAM_MAX tokens that occurred earlier, its most recent occurrence, and up to max_tokens
    of the tokens that followed it (never past the end of the context)."""
    length = len(ctx)
    if max_tokens == 0 or length < 2:
        return []
    cap = min(NGRAM_MAX, length - 1)
    best_n = best_end = 0
    for e in range(length - 2, -1, -1):  # match ends, most recent first
        if ctx[e] != ctx[-1]:
            continue
        m = 1
        while m < cap and m <= e and ctx[e - m] == ctx[length - 1 - m]:
            m += 1
        if m > best_n and m >= NGRAM_MIN:
            best_n, best_end = m, e
            if m == cap:
                break
    if best_n == 0:
        return []
    return ctx[best_end + 1: best_end + 1 + max_tokens]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def any_candidate_accept(ctx: list[int], future: list[int]) -> tuple[int, bool]:
    """The longest prefix of `future` that some continuation of an earlier occurrence of the
    last context token predicts (copying on into its own proposal, as an overlapping copy
    does), and whether any candidate exists at all."""
    length = len(ctx)
    best, found = 0, False
    for e in range(length - 1):
        if ctx[e] != ctx[-1]:
            continue
        found = True
        a, src = 0, e + 1
        while a < len(future):
            tok = ctx[src + a] if src + a < length else future[src + a - length]
            if tok != future[a]:
                break
            a += 1
        best = max(best, a)
    return best, found


def chain_accept(pairs: set[tuple[int, int]], last: int, future: list[int]) -> int:
    """The longest prefix of `future` in which every token followed its predecessor (the last
    context token for the first one) somewhere earlier: in the context (`pairs`, its adjacent
    token pairs) or in the accepted prefix itself."""
    seen, prev, a = set(), last, 0
    while a < len(future) and ((prev, future[a]) in pairs or (prev, future[a]) in seen):
        seen.add((prev, future[a]))
        prev = future[a]
        a += 1
    return a


def acceptance_profile(prompt: list[int], gen: list[int], max_window: int) -> dict:
    """Per decode position i (tokens gen[:i] known, gen[i] next), what each oracle accepts
    with the largest window (a smaller window k accepts min(that, k) for every oracle)."""
    n = len(gen)
    pl_accept, pl_len, any_accept, any_found, chain = [], [], [], [], []
    pairs = set(zip(prompt, prompt[1:]))
    for i in range(1, n):
        ctx = prompt + gen[:i]
        if len(ctx) >= 2:
            pairs.add((ctx[-2], ctx[-1]))
        room = min(max_window, n - i - 1)  # the request may still emit n - i tokens
        future = gen[i:i + room]
        draft = prompt_lookup_draft(ctx, room)
        pl_accept.append(common_prefix(draft, future))
        pl_len.append(len(draft))
        a, found = any_candidate_accept(ctx, future)
        any_accept.append(a)
        any_found.append(found)
        chain.append(chain_accept(pairs, ctx[-1], future))
    return {"pl_accept": pl_accept, "pl_len": pl_len, "any_accept": any_accept, "any_found": any_found,
            "chain_accept": chain}


def tokens_per_forward(accept: list[int], k: int) -> float:
    """Decode tokens per decode forward of a scheme that always speculates with window k
    and verifies for free; accept[j] = accepted drafts at position j + 1 with an unbounded
    window (already capped by the tokens left)."""
    i, steps, n = 0, 0, len(accept)  # accept covers decode positions 1..N-1
    while i < n:
        i += min(accept[i], k) + 1
        steps += 1
    return n / steps


def head_and_rest(accept: list[int], head: int = 64) -> tuple[float, float]:
    """Zero-cost tokens per forward (unbounded window) over the first `head` decode tokens,
    where the model would be continuing the given text, and over the rest of the run."""
    first = [min(a, head - 1 - j) for j, a in enumerate(accept[:head - 1])]  # no step crosses the split
    return tokens_per_forward(first, len(accept)), tokens_per_forward(accept[head - 1:], len(accept))


# ---------------------------------------------------------------- forward cost curve

def step_cost_run(binary: Path, model: Path, threads: int, context: int, iters: int,
                  min_tokens: int, max_tokens: int) -> dict[int, dict[str, float]]:
    """One bench_spec_step_cost run: {tokens: {"median": us, "p20": us}}."""
    cmd = [str(binary), str(model), "--threads", str(threads), "--context", str(context), "--iters", str(iters),
           "--min-tokens", str(min_tokens), "--max-tokens", str(max_tokens)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = {}
    for m in re.finditer(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \|", out, re.M):
        rows[int(m.group(1))] = {"median": float(m.group(2)), "p20": float(m.group(3))}
    if 1 not in rows:
        sys.exit(f"cannot parse bench_spec_step_cost output:\n{out}")
    return rows


def measure_cost_curve(binary: Path, model: Path, threads: int, contexts: list[int], iters: int,
                       stat: str) -> dict[int, dict[int, float]]:
    """{context: {tokens: us per forward}}: 1..16 tokens in one run, each EXTRA_TOKENS size in
    its own run, scaled by the ratio of the two runs' 1-token times (drift between runs)."""
    curve = {}
    for c in contexts:
        main = step_cost_run(binary, model, threads, c, iters, 1, MAIN_MAX_TOKENS)
        row = {n: v[stat] for n, v in main.items()}
        for extra in EXTRA_TOKENS:
            r = step_cost_run(binary, model, threads, c, iters, extra, extra)
            row[extra] = r[extra][stat] * row[1] / r[1][stat]
        curve[c] = row
        print(f"  cost {model.name} context {c}: " + " ".join(f"{n}:{v:.0f}" for n, v in sorted(row.items())),
              file=sys.stderr)
    return curve


class CostModel:
    """C(tokens, context) in µs, linear between measured forward sizes and between measured
    contexts, held constant outside the measured context range."""

    def __init__(self, curve: dict[int, dict[int, float]]):
        self.contexts = sorted(curve)
        self.sizes = sorted(curve[self.contexts[0]])
        self.curve = curve
        self.max_tokens = self.sizes[-1]

    def _at_context(self, c: int, n: int) -> float:
        row = self.curve[c]
        j = bisect.bisect_left(self.sizes, n)
        if self.sizes[j] == n:
            return row[n]
        lo, hi = self.sizes[j - 1], self.sizes[j]
        return row[lo] + (row[hi] - row[lo]) * (n - lo) / (hi - lo)

    def __call__(self, n: int, context: int) -> float:
        cs = self.contexts
        if context <= cs[0]:
            return self._at_context(cs[0], n)
        if context >= cs[-1]:
            return self._at_context(cs[-1], n)
        j = bisect.bisect_left(cs, context)
        lo, hi = cs[j - 1], cs[j]
        w = (context - lo) / (hi - lo)
        return (1 - w) * self._at_context(lo, n) + w * self._at_context(hi, n)


# ---------------------------------------------------------------- cost-aware ceilings

def plain_cost(prompt_len: int, n: int, cost: CostModel) -> float:
    """µs for the n - 1 decode steps of plain decoding (position i feeds gen[i-1])."""
    return sum(cost(1, prompt_len + i - 1) for i in range(1, n))


def foresight_cost(prompt_len: int, accept: list[int], cost: CostModel) -> float:
    """Cheapest schedule with perfect foresight: from position i, one forward may emit any
    m <= accept + 1 tokens (at most the largest measured forward) for C(m, context)."""
    n = len(accept) + 1
    best = [0.0] * (n + 1)  # best[i]: µs to emit gen[i:] given gen[:i]
    for i in range(n - 1, 0, -1):
        ctx = prompt_len + i - 1
        top = min(accept[i - 1] + 1, n - i, cost.max_tokens)
        best[i] = min(cost(m, ctx) + best[i + m] for m in range(1, top + 1))
    return best[1]


def fixed_window_cost(prompt_len: int, accept: list[int], draft_len: list[int], k: int,
                      cost: CostModel) -> float:
    """µs when every step verifies min(k, its draft's length) drafts (no foresight of how
    many will be accepted) and emits the accepted ones plus one."""
    n = len(accept) + 1
    i, total = 1, 0.0
    while i < n:
        d = min(k, draft_len[i - 1])
        total += cost(d + 1, prompt_len + i - 1)
        i += min(accept[i - 1], d) + 1
    return total


def prompt_ceilings(prompt: list[int], gen: list[int], cost: CostModel) -> dict:
    """Everything reported for one prompt."""
    prof = acceptance_profile(prompt, gen, max(WINDOWS))
    n, p = len(gen), len(prompt)
    any_len = [min(max(WINDOWS), n - i - 1) if f else 0 for i, f in enumerate(prof["any_found"], start=1)]
    base = plain_cost(p, n, cost)
    fixed = [k for k in WINDOWS if k + 1 <= cost.max_tokens]
    fixed_any = {k: base / fixed_window_cost(p, prof["any_accept"], any_len, k, cost) for k in fixed}
    fixed_pl = {k: base / fixed_window_cost(p, prof["pl_accept"], prof["pl_len"], k, cost) for k in fixed}
    k_any = max(fixed_any, key=fixed_any.get)
    k_pl = max(fixed_pl, key=fixed_pl.get)
    return {
        "prompt_tokens": p,
        "tpf_lookup": {k: tokens_per_forward(prof["pl_accept"], k) for k in WINDOWS},
        "tpf_any": {k: tokens_per_forward(prof["any_accept"], k) for k in WINDOWS},
        "tpf_chain": {k: tokens_per_forward(prof["chain_accept"], k) for k in WINDOWS},
        "tpf_any_head_rest": head_and_rest(prof["any_accept"]),
        "plain_us_per_token": base / (n - 1),
        "foresight_chain": base / foresight_cost(p, prof["chain_accept"], cost),
        "foresight_any": base / foresight_cost(p, prof["any_accept"], cost),
        "foresight_lookup": base / foresight_cost(p, prof["pl_accept"], cost),
        "fixed_any": (k_any, fixed_any[k_any]),
        "fixed_lookup": (k_pl, fixed_pl[k_pl]),
    }


# ---------------------------------------------------------------- running and reporting

def wait_for_quiet(max_load: float, timeout_s: float) -> float:
    """Wait (up to timeout_s) until the 1-minute load average is below max_load."""
    t0 = time.time()
    while os.getloadavg()[0] >= max_load and time.time() - t0 < timeout_s:
        time.sleep(5)
    return os.getloadavg()[0]


def auto_contexts(prompt_lens: list[int], n: int) -> list[int]:
    """Three contexts spanning every run of a model: shortest prompt, middle, longest end."""
    lo, hi = min(prompt_lens), max(prompt_lens) + n - 1
    return sorted({lo, (lo + hi) // 2, hi})


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """median (worst-best) over prompts."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def all_accepted_bound(row: dict[int, float]) -> tuple[int, float]:
    """The speedup if every draft were accepted: the best m * C(1) / C(m) over measured sizes
    m (one forward of m tokens replacing m plain steps), and that m."""
    m = max(row, key=lambda n: n * row[1] / row[n])
    return m, m * row[1] / row[m]


def markdown(results: dict, curves: dict, header: str, stat: str) -> str:
    lines = [header, "", f"Forward cost C(m), µs per forward of m tokens ({stat} of bench_spec_step_cost; 32 and "
                         "64 tokens scaled to the main run's 1-token time). All accepted: the speedup if every "
                         "draft were accepted, best m * C(1) / C(m).", ""]
    for name, curve in curves.items():
        sizes = sorted(next(iter(curve.values())))
        lines += ["| model | context | " + " | ".join(map(str, sizes)) + " | C(6)/C(1) | all accepted |",
                  "|---|---:|" + "---:|" * (len(sizes) + 2)]
        for c, row in sorted(curve.items()):
            m, gain = all_accepted_bound(row)
            lines.append(f"| {name} | {c} | " + " | ".join(f"{row[s]:.0f}" for s in sizes) +
                         f" | {row[6] / row[1]:.2f} | {gain:.2f}x (m={m}) |")
        lines.append("")
    lines += ["Zero-cost ceiling, tokens per forward by window k: median over prompts (worst-best).", "",
              "| model | workload | oracle | " + " | ".join(f"k={k}" for k in WINDOWS) + " |",
              "|---|---|---|" + "---:|" * len(WINDOWS)]
    for (name, workload), per in results.items():
        for key, label in (("tpf_lookup", "prompt lookup"), ("tpf_any", "any candidate"), ("tpf_chain", "any chain")):
            lines.append(f"| {name} | {workload} | {label} | " +
                         " | ".join(spread([r[key][k] for r in per]) for k in WINDOWS) + " |")
    lines += ["", "Cost-aware ceiling, speedup over plain decoding at the measured forward costs: median over "
                  "prompts (worst-best). Foresight: verifies exactly the tokens that will be accepted. Best fixed "
                  "window: the single k (per prompt) that does best, shown as the most common k.", "",
              "| model | workload | plain µs/token | copied share (any, k=64) | tokens/forward (any, k=64): "
              "first 64 tokens / rest | foresight, any chain | foresight, any candidate | foresight, prompt lookup | "
              "best fixed k, any candidate | best fixed k, prompt lookup |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, workload), per in results.items():
        copied = [1 - 1 / r["tpf_any"][max(WINDOWS)] for r in per]
        k_any = statistics.mode([r["fixed_any"][0] for r in per])
        k_pl = statistics.mode([r["fixed_lookup"][0] for r in per])
        lines.append(f"| {name} | {workload} | {spread([r['plain_us_per_token'] for r in per], '{:.1f}')} | "
                     f"{spread(copied)} | {spread([r['tpf_any_head_rest'][0] for r in per])} / "
                     f"{spread([r['tpf_any_head_rest'][1] for r in per])} | "
                     f"{spread([r['foresight_chain'] for r in per])}x | "
                     f"{spread([r['foresight_any'] for r in per])}x | "
                     f"{spread([r['foresight_lookup'] for r in per])}x | "
                     f"k={k_any}: {spread([r['fixed_any'][1] for r in per])}x | "
                     f"k={k_pl}: {spread([r['fixed_lookup'][1] for r in per])}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default=str(REPO / "build" / "bin" / "flashdllm"))
    ap.add_argument("--step-cost", default=str(REPO / "build" / "bin" / "bench_spec_step_cost"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--contexts", help="contexts for the cost curve, e.g. 100,300,600 (default: three "
                                       "spanning the model's runs); applies to every model given")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--costs", help="reuse the cost curves of an earlier --json output instead of measuring")
    ap.add_argument("--stat", choices=["median", "p20"], default="median",
                    help="which forward time of bench_spec_step_cost to use")
    ap.add_argument("--max-load", type=float, default=1.5, help="wait for a load average below this before timing")
    ap.add_argument("--wait", type=float, default=300, help="longest wait for --max-load, seconds")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    cli, step_cost = Path(args.cli), Path(args.step_cost)
    for b in (cli, step_cost):
        if not b.exists():
            sys.exit(f"{b} not found; build it (see the usage line)")

    results, curves, loads, records = {}, {}, [], []
    for name in args.models.split(","):
        cfg = MODELS[name]
        runs = {w: [plain_run(cli, cfg["path"], p, cfg["n"], args.threads) for p in cfg[w]]
                for w in ("grounded", "free")}
        contexts = ([int(c) for c in args.contexts.split(",")] if args.contexts else
                    auto_contexts([len(p) for rs in runs.values() for p, _ in rs], cfg["n"]))
        if args.costs:
            saved = json.loads(Path(args.costs).read_text())["cost_curves"][name]
            curves[name] = {int(c): {int(n): v for n, v in row.items()} for c, row in saved.items()}
        else:
            loads.append(wait_for_quiet(args.max_load, args.wait))
            curves[name] = measure_cost_curve(step_cost, cfg["path"], args.threads, contexts, args.iters, args.stat)
            loads.append(os.getloadavg()[0])
        cost = CostModel(curves[name])
        for workload, rs in runs.items():
            results[(name, workload)] = [prompt_ceilings(p, g, cost) for p, g in rs]
            for pi, r in enumerate(results[(name, workload)]):
                records.append({"model": name, "workload": workload, "prompt": pi, **r})

    costs = (f"cost curves from {args.costs}" if args.costs else
             f"cost iters {args.iters}, load average {min(loads):.1f}-{max(loads):.1f} around the cost runs")
    header = (f"spec_ceiling: {cli.relative_to(REPO) if cli.is_relative_to(REPO) else cli}, {args.threads} thread(s), "
              f"{costs}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    text = markdown(results, curves, header, args.stat)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "stat": args.stat,
                                               "cost_curves": {m: {str(c): {str(n): v for n, v in row.items()}
                                                                   for c, row in cv.items()}
                                                               for m, cv in curves.items()},
                                               "prompts": records}, indent=1))


if __name__ == "__main__":
    main()
