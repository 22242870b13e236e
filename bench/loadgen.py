#!/usr/bin/env python3
"""Open-loop load generator for OpenAI-compatible completion servers.

Sends streaming `/v1/completions` requests (stream=true, stream_options.include_usage,
temperature 0) with Poisson arrivals and measures, on the client, per request:

  TTFT  time to first token: request sent -> first streamed chunk carrying text (ms)
  ITL   inter-token latency: gaps between consecutive text chunks (ms); a server that packs
        several tokens into one chunk shows one gap for them
  e2e   request sent -> stream finished (ms)

and reports p50/p95/p99, mean and standard deviation of each, for all requests and
separately for short and long prompts, plus throughput (output tokens/s from the servers'
usage counts, falling back to the number of text chunks; completed requests/s) and errors
with their messages. A failed request is counted and its message kept; it never stops the run.

Workload (deterministic for a given --seed, so two servers can be compared on the same
requests):
  * arrivals: Poisson process at --rate requests/s, for --duration s or --num-requests N;
    the schedule is open-loop: a request is sent at its arrival time whatever is in flight.
  * each request is short with probability --short-frac, else long; its prompt length is
    drawn uniformly from --short-prompt or --long-prompt (a range "LO-HI" or one number).
  * prompt lengths are counted in WORDS, not model tokens: a prompt of N "tokens" is N words
    drawn from a built-in English word list (or --tokenizer-words FILE, whitespace-separated
    words). For typical BPE/SentencePiece vocabularies one common word is about 1-1.5 tokens.
  * with probability --shared-prefix-frac, a request's prompt starts with one common prefix of
    --shared-prefix-tokens words (the same for the whole run), followed by its own body of
    the drawn length: this exercises prefix caching.
  * max_tokens is drawn uniformly from --output-tokens.

Usage:
  python3 bench/loadgen.py --url http://127.0.0.1:8080/v1 --model NAME --rate 4 --duration 30 \\
      --short-frac 0.8 --short-prompt 32-96 --long-prompt 600-900 --output-tokens 16-64 \\
      --shared-prefix-frac 0.3 --shared-prefix-tokens 256 --seed 1 \\
      --json out.json --png out.png [--api-key K] [--tokenizer-words FILE]

  --model may be omitted: the first id from GET {url}/models is used.
  A llama.cpp peer for comparison: bench/peer_llamacpp_server.sh.

Outputs: a table on stdout; --json writes the configuration, the summary and every request's
record (times in ms); --png writes CDFs of TTFT, ITL and e2e per class and TTFT over time.
Exit status: 0 if at least one request succeeded, 2 if none did, 1 for bad arguments.

Needs Python >= 3.10, the `openai` package (AsyncOpenAI, used with max_retries=0 so retries
never hide failures or distort latencies), numpy, and matplotlib for --png.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field

# A plain vocabulary of common English words: realistic token counts without shipping text.
_WORDS = """the of and to in is was that for it with as on be at by this had not are but
from or have an they which one you were all we her she there would their will when who him
been has more if no out so said what up its about than into them can only other new some
could time these two may then do first any my now such like our over man me even most made
after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see men
work long get here between both life being under never day same another know while last
might us great old year off come since against go came right used take three small house
system water number story river forest garden window market school music paper light
mountain village city road table chair letter family friend morning evening summer winter
kitchen answer question problem reason engine model memory cache token server request
stream batch queue thread signal value result""".split()


def parse_range(text: str, name: str) -> tuple[int, int]:
    """Parses "LO-HI" or "N" into an inclusive integer range; exits with a message if bad."""
    try:
        if "-" in text:
            lo_s, hi_s = text.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
        else:
            lo = hi = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: expected N or LO-HI, got {text!r}") from None
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"{name}: need 1 <= LO <= HI, got {text!r}")
    return lo, hi


@dataclass
class Planned:
    """One request of the schedule, fixed before the run starts."""
    index: int
    arrival_s: float           # offset from the run start
    cls: str                   # "short" | "long"
    prompt_words: int          # body words (without the shared prefix)
    shared_prefix: bool
    max_tokens: int
    prompt: str = field(repr=False, default="")


@dataclass
class Result:
    index: int
    cls: str
    shared_prefix: bool
    prompt_words: int
    max_tokens: int
    arrival_s: float
    sent_s: float = math.nan        # actual send time, offset from the run start
    ok: bool = False
    error: str = ""
    ttft_ms: float = math.nan
    e2e_ms: float = math.nan
    itl_ms: list[float] = field(default_factory=list)
    chunks: int = 0                 # streamed chunks that carried text
    output_tokens: int = 0          # from usage if the server sent it, else chunks
    usage_reported: bool = False
    prompt_tokens: int | None = None
    finish_reason: str | None = None


def build_schedule(args: argparse.Namespace, words: list[str]) -> list[Planned]:
    # Two streams: the schedule (arrivals, classes, lengths) must not depend on the word list,
    # so --tokenizer-words changes the text but not the load.
    rng = random.Random(args.seed)
    text_rng = random.Random(f"loadgen-text-{args.seed}")
    prefix = " ".join(text_rng.choice(words) for _ in range(args.shared_prefix_tokens))
    plan: list[Planned] = []
    t = 0.0
    while True:
        t += rng.expovariate(args.rate)
        if args.num_requests is not None:
            if len(plan) >= args.num_requests:
                break
        elif t > args.duration:
            break
        short = rng.random() < args.short_frac
        lo, hi = args.short_prompt if short else args.long_prompt
        n = rng.randint(lo, hi)
        shared = args.shared_prefix_tokens > 0 and rng.random() < args.shared_prefix_frac
        mt = rng.randint(*args.output_tokens)
        # A unique first word keeps two requests with the same body from being identical.
        body = f"request{len(plan)} " + " ".join(text_rng.choice(words) for _ in range(n - 1))
        prompt = (prefix + " " + body) if shared else body
        plan.append(Planned(len(plan), t, "short" if short else "long", n, shared, mt, prompt))
    return plan


async def run_one(client, model: str, p: Planned, t0: float, args) -> Result:
    r = Result(p.index, p.cls, p.shared_prefix, p.prompt_words, p.max_tokens, p.arrival_s)
    delay = t0 + p.arrival_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    start = time.perf_counter()
    r.sent_s = start - t0
    last = None
    try:
        extra = {"ignore_eos": True} if args.ignore_eos else None
        stream = await client.completions.create(
            model=model, prompt=p.prompt, max_tokens=p.max_tokens, temperature=0.0,
            stream=True, stream_options={"include_usage": True}, extra_body=extra)
        async for chunk in stream:
            now = time.perf_counter()
            text = "".join((c.text or "") for c in (chunk.choices or []))
            for c in chunk.choices or []:
                if c.finish_reason:
                    r.finish_reason = c.finish_reason
            if chunk.usage is not None:
                r.usage_reported = True
                r.output_tokens = chunk.usage.completion_tokens or 0
                r.prompt_tokens = chunk.usage.prompt_tokens
            if text:
                if last is None:
                    r.ttft_ms = (now - start) * 1e3
                else:
                    r.itl_ms.append((now - last) * 1e3)
                last = now
                r.chunks += 1
        r.e2e_ms = (time.perf_counter() - start) * 1e3
        if not r.usage_reported:
            r.output_tokens = r.chunks
        # A stream must end with a finish_reason: without one it was cut short (a server that
        # aborts or interrupts streams must not look fast).
        # An empty completion (EOS first) is valid: it counts as ok with no TTFT/ITL sample.
        if r.finish_reason is None:
            r.error = "stream ended without a finish_reason (truncated)"
        else:
            r.ok = True
    except asyncio.CancelledError:
        r.error = "cancelled at the end of the run (still running after --drain-timeout)"
    except Exception as e:  # any failure is a data point, never a crash
        msg = str(e).strip().replace("\n", " ")
        cause = e.__cause__ or e.__context__  # e.g. "Connection error." hides ECONNREFUSED
        if cause is not None and str(cause) and str(cause) not in msg:
            msg = f"{msg} ({type(cause).__name__}: {str(cause).strip()})"
        r.error = f"{type(e).__name__}: {msg[:300]}" if msg else type(e).__name__
        r.e2e_ms = (time.perf_counter() - start) * 1e3
    return r


def stats(values: list[float]) -> dict:
    import numpy as np
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if v.size == 0:
        return {"n": 0}
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "stddev": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "p50": float(np.percentile(v, 50)),
        "p95": float(np.percentile(v, 95)),
        "p99": float(np.percentile(v, 99)),
        "min": float(v.min()),
        "max": float(v.max()),
    }


def summarize(results: list[Result], wall_s: float) -> dict:
    out: dict = {"wall_s": wall_s, "classes": {}}
    groups = {"all": results,
              "short": [r for r in results if r.cls == "short"],
              "long": [r for r in results if r.cls == "long"],
              "shared_prefix": [r for r in results if r.shared_prefix]}
    for name, rs in groups.items():
        ok = [r for r in rs if r.ok]
        out["classes"][name] = {
            "requests": len(rs),
            "ok": len(ok),
            "errors": len(rs) - len(ok),
            "empty": sum(1 for r in ok if r.chunks == 0),  # ok but no text: no TTFT sample
            "output_tokens": sum(r.output_tokens for r in ok),
            "ttft_ms": stats([r.ttft_ms for r in ok]),
            "itl_ms": stats([x for r in ok for x in r.itl_ms]),
            "e2e_ms": stats([r.e2e_ms for r in ok]),
        }
    ok = [r for r in results if r.ok]
    out["throughput"] = {
        "output_tok_per_s": sum(r.output_tokens for r in ok) / wall_s if wall_s > 0 else 0.0,
        "req_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "usage_reported_frac": (sum(r.usage_reported for r in ok) / len(ok)) if ok else 0.0,
    }
    errs = collections.Counter(r.error for r in results if not r.ok)
    out["errors"] = [{"message": m, "count": c} for m, c in errs.most_common()]
    return out


def print_table(summary: dict, args) -> None:
    def fmt(s: dict, k: str) -> str:
        return f"{s[k]:9.1f}" if s.get("n") else f"{'-':>9}"
    print(f"\nwall {summary['wall_s']:.1f} s   target rate {args.rate} req/s")
    hdr = f"{'class':<14}{'metric':<6}{'n':>7}{'p50':>9}{'p95':>9}{'p99':>9}{'mean':>9}{'stddev':>9}"
    print(hdr)
    print("-" * len(hdr))
    for name, c in summary["classes"].items():
        if c["requests"] == 0:
            continue
        label = f"{name} ({c['ok']}/{c['requests']})"
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            s = c[metric]
            print(f"{label:<14.14}{metric[:-3].upper():<6}{s.get('n', 0):>7}"
                  + "".join(fmt(s, k) for k in ("p50", "p95", "p99", "mean", "stddev")))
            label = ""
    t = summary["throughput"]
    print(f"\nthroughput: {t['output_tok_per_s']:.1f} output tok/s, {t['req_per_s']:.2f} req/s "
          f"(usage counts from server for {t['usage_reported_frac']*100:.0f}% of requests)")
    if summary["errors"]:
        total = sum(e["count"] for e in summary["errors"])
        print(f"errors: {total}")
        for e in summary["errors"][:10]:
            print(f"  {e['count']:5d} x {e['message']}")
    else:
        print("errors: 0")
    print("latencies in ms")


def write_png(path: str, results: list[Result]) -> None:
    import matplotlib
    matplotlib.use("Agg")  # headless: no display on servers
    import matplotlib.ticker
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    colors = {"short": "tab:blue", "long": "tab:orange"}

    def cdf(ax, values, label, color):
        v = np.sort(np.asarray([x for x in values if not math.isnan(x)]))
        if v.size:
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=f"{label} (n={v.size})",
                    color=color)

    for ax, metric, title in ((axes[0][0], "ttft", "TTFT"), (axes[0][1], "itl", "inter-token latency"),
                              (axes[1][0], "e2e", "end-to-end latency")):
        for cls in ("short", "long"):
            rs = [r for r in results if r.ok and r.cls == cls]
            vals = [x for r in rs for x in r.itl_ms] if metric == "itl" else \
                [getattr(r, metric + "_ms") for r in rs]
            cdf(ax, vals, cls, colors[cls])
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of " + ("gaps" if metric == "itl" else "requests"))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        if metric != "itl" and any(r.ok for r in results):
            ax.set_xscale("log")  # TTFT/e2e span ms to tens of s under load
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no label clutter
    ax = axes[1][1]
    for cls in ("short", "long"):
        rs = [r for r in results if r.ok and r.cls == cls]
        ax.scatter([r.sent_s for r in rs], [r.ttft_ms for r in rs], s=8, label=cls, color=colors[cls])
    bad = [r for r in results if not r.ok]
    if bad:
        ax.scatter([r.arrival_s for r in bad], [0] * len(bad), marker="x", color="red",
                   label=f"errors ({len(bad)})")
    ax.set_title("TTFT over the run")
    ax.set_xlabel("send time (s)")
    ax.set_ylabel("TTFT (ms)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def resolve_model(client, model: str | None) -> str:
    if model:
        return model
    page = await client.models.list()
    ids = [m.id for m in page.data]
    if not ids:
        raise RuntimeError("GET /models returned no model; pass --model")
    return ids[0]


async def run(args, plan: list[Planned]) -> tuple[list[Result], float, str]:
    from openai import AsyncOpenAI
    client = AsyncOpenAI(base_url=args.url, api_key=args.api_key, max_retries=0,
                         timeout=args.request_timeout)
    try:
        model = await resolve_model(client, args.model)
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(run_one(client, model, p, t0, args)) for p in plan]
        last_arrival = plan[-1].arrival_s if plan else 0.0
        done, pending = await asyncio.wait(tasks, timeout=last_arrival + args.drain_timeout)
        for t in pending:
            t.cancel()
        results = [await t for t in tasks]  # run_one turns cancellation into an error record
        ends = [t0 + r.sent_s + r.e2e_ms / 1e3 for r in results if r.ok]
        wall = (max(ends) - t0) if ends else time.perf_counter() - t0
        return results, wall, model
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="base URL ending in /v1, e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--model", help="model id (default: first id from GET /models)")
    ap.add_argument("--api-key", default="none", help="sent as Bearer token (default: 'none')")
    ap.add_argument("--rate", type=float, default=4.0, help="mean arrival rate, requests/s (Poisson)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--duration", type=float, default=30.0, help="schedule length in s (default 30)")
    g.add_argument("--num-requests", type=int, help="send exactly N requests instead of --duration")
    ap.add_argument("--short-frac", type=float, default=0.8, help="fraction of short requests")
    ap.add_argument("--short-prompt", default="32-96", help="short prompt length in words, LO-HI")
    ap.add_argument("--long-prompt", default="600-900", help="long prompt length in words, LO-HI")
    ap.add_argument("--output-tokens", default="16-64", help="max_tokens range, LO-HI")
    ap.add_argument("--shared-prefix-frac", type=float, default=0.0,
                    help="fraction of requests starting with the common prefix")
    ap.add_argument("--shared-prefix-tokens", type=int, default=256,
                    help="length of the common prefix in words")
    ap.add_argument("--seed", type=int, default=1, help="seed of the whole workload")
    ap.add_argument("--tokenizer-words", metavar="FILE",
                    help="draw prompt words from FILE (whitespace-separated) instead of the built-in list")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="send ignore_eos=true (non-standard; llama.cpp and vLLM accept it)")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="per-request timeout in s")
    ap.add_argument("--drain-timeout", type=float, default=300.0,
                    help="after the last arrival, wait at most this many s for requests in flight")
    ap.add_argument("--json", help="write summary and per-request records to this file")
    ap.add_argument("--png", help="write latency plots to this PNG file")
    ap.add_argument("--quiet", action="store_true", help="no table on stdout")
    args = ap.parse_args(argv)

    try:
        args.short_prompt = parse_range(args.short_prompt, "--short-prompt")
        args.long_prompt = parse_range(args.long_prompt, "--long-prompt")
        args.output_tokens = parse_range(args.output_tokens, "--output-tokens")
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if not (args.rate > 0 and math.isfinite(args.rate)):
        ap.error("--rate must be > 0")
    if args.num_requests is None and not (args.duration > 0):
        ap.error("--duration must be > 0")
    if args.num_requests is not None and args.num_requests < 1:
        ap.error("--num-requests must be >= 1")
    for name in ("short_frac", "shared_prefix_frac"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            ap.error(f"--{name.replace('_', '-')} must be in [0, 1]")
    if args.shared_prefix_tokens < 0:
        ap.error("--shared-prefix-tokens must be >= 0")
    if args.request_timeout <= 0 or args.drain_timeout <= 0:
        ap.error("--request-timeout and --drain-timeout must be > 0")

    words = _WORDS
    if args.tokenizer_words:
        try:
            with open(args.tokenizer_words, encoding="utf-8") as f:
                words = f.read().split()
        except OSError as e:
            ap.error(f"--tokenizer-words: {e}")
        if not words:
            ap.error(f"--tokenizer-words: {args.tokenizer_words} has no words")

    plan = build_schedule(args, words)
    if not plan:
        ap.error("the schedule is empty: raise --rate or --duration")
    if not args.quiet:
        n_short = sum(p.cls == "short" for p in plan)
        print(f"{len(plan)} requests ({n_short} short, {len(plan) - n_short} long, "
              f"{sum(p.shared_prefix for p in plan)} with the shared prefix) over "
              f"{plan[-1].arrival_s:.1f} s to {args.url}", flush=True)

    try:
        results, wall, model = asyncio.run(run(args, plan))
    except Exception as e:  # only reachable before any request (model lookup, client setup)
        print(f"loadgen: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    summary = summarize(results, wall)
    if not args.quiet:
        print(f"model: {model}")
        print_table(summary, args)
    if args.json:
        cfg = {k: v for k, v in vars(args).items() if k not in ("json", "png", "api_key")}
        record = {"config": cfg, "model": model, "summary": summary,
                  "requests": [asdict(r) for r in results]}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(_json_safe(record), f, indent=1)
    if args.png:
        write_png(args.png, results)
    return 0 if any(r.ok for r in results) else 2


def _json_safe(x):
    """NaN is not valid JSON: write null instead (e.g. the TTFT of a failed request)."""
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


if __name__ == "__main__":
    sys.exit(main())
