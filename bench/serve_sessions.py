#!/usr/bin/env python3
"""Multi-turn chat sessions against an OpenAI-compatible server: the KV-tier serving benchmark.

Sessions arrive as a Poisson process (--rate sessions/s, --sessions in all). Every session
starts with one shared system prompt (--system-tokens ids, the same for all sessions) and a
first message that brings its first prompt to a length drawn from --first-tokens (LO-HI);
it then runs a number of turns drawn from --turns (LO-HI). Each turn is one streamed
/v1/completions request (temperature 0, --answer-tokens new tokens) whose prompt is the whole
conversation so far as token ids; between turns the user "thinks" for an exponentially
distributed time of mean --think-s. The next turn's prompt is the last prompt, an answer of
as many ids as the server generated (the client's own ids: the server returns text, and a
real client re-tokenizes it, so only the answer's blocks are new to the server either way) and
a new message of --message-tokens ids. All ids are random in [10, --vocab), from --seed, so two
servers (or placements) see the same requests.

Measured on the client, per request: TTFT (request sent -> first chunk with text), ITL (gaps
between consecutive text chunks; flashdllm streams one chunk per token, but a server writes
what is ready at once, so on a model faster than the client reads, the gaps are the server's
write batching, not per-token time), and the completion tokens from the usage chunk. A
stream that ends without `data: [DONE]`, or carries an error event, is a failed request.
Reported: p50/p95 TTFT of first and of returning turns, ITL p50/p95/stddev, output tokens/s
over the run, errors. Exit status: 0 when every request succeeded, 1 for bad arguments or
when some failed (the first error on stderr), 2 when none succeeded or the server cannot be
reached, 130 when interrupted.

Standard library only (it runs on machines that cannot install packages). Binds nothing;
connects to --url (loopback in the project's runs).

  python3 bench/serve_sessions.py --url http://127.0.0.1:8080/v1 --sessions=24 --rate 0.5 \\
      --turns 4-8 --first-tokens 1000-4000 --json out.json
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    a, b = int(lo), int(hi or lo)
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"expected N or LO-HI with 1 <= LO <= HI, got {text!r}")
    return a, b


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))]


def stats(values: list[float]) -> dict:
    return {"n": len(values), "mean": statistics.fmean(values) if values else 0.0, "p50": pct(values, 0.5),
            "p95": pct(values, 0.95), "stddev": statistics.stdev(values) if len(values) > 1 else 0.0}


class Client:
    def __init__(self, url: str, model: str | None, timeout: float):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"--url must be http://HOST[:PORT]/v1 (plain HTTP), got {url!r}")
        self.host, self.port, self.base = u.hostname, u.port or 80, u.path.rstrip("/")
        self.timeout = timeout
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            c.request("GET", self.base + "/models")
            r = c.getresponse()
            raw = r.read()
        finally:
            c.close()
        if r.status != 200:
            raise ValueError(f"GET {self.base}/models returned HTTP {r.status} (does --url end in /v1?)")
        try:
            return json.loads(raw)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ValueError(f"GET {self.base}/models did not list a model: {raw[:120]!r}") from None

    def complete(self, prompt: list[int], max_tokens: int) -> dict:
        """One streamed completion: {"ttft_ms", "gaps_ms", "tokens", "error"}."""
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}})
        out = {"ttft_ms": None, "gaps_ms": [], "tokens": 0, "error": None}
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        t0 = time.perf_counter()
        try:
            c.request("POST", self.base + "/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                out["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
                return out
            last = None
            chunks = 0
            done = False
            for raw in r:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                    continue
                if not line.startswith("data: "):
                    continue
                msg = json.loads(line[6:])
                if "error" in msg:
                    out["error"] = f"error event: {json.dumps(msg['error'])[:200]}"
                    return out
                if msg.get("usage"):
                    out["tokens"] = msg["usage"].get("completion_tokens", 0)
                if any(ch.get("text") for ch in msg.get("choices", [])):
                    now = time.perf_counter()
                    chunks += 1
                    if last is None:
                        out["ttft_ms"] = (now - t0) * 1e3
                    else:
                        out["gaps_ms"].append((now - last) * 1e3)
                    last = now
            out["tokens"] = out["tokens"] or chunks
            if not done:
                out["error"] = "the stream ended without data: [DONE]"
        except Exception as e:  # a failed request is counted, never stops the run
            out["error"] = f"{type(e).__name__}: {e}"
        finally:
            c.close()
        return out


def run(args) -> dict:
    rng = random.Random(args.seed)
    ids = lambda n: [rng.randrange(10, args.vocab) for _ in range(n)]
    system = ids(args.system_tokens)
    plans = []
    t = 0.0
    for s in range(args.sessions):
        t += rng.expovariate(args.rate)
        first = rng.randint(*args.first_tokens)
        turns = rng.randint(*args.turns)
        plans.append({"start": t, "first": system + ids(max(1, first - len(system))), "turns": turns,
                      "messages": [ids(args.message_tokens) for _ in range(turns)],
                      "answers": [ids(args.answer_tokens) for _ in range(turns)],
                      "think": [rng.expovariate(1.0 / args.think_s) if args.think_s > 0 else 0.0
                                for _ in range(turns)]})
    client = Client(args.url, args.model, args.request_timeout)
    lock = threading.Lock()
    records = []
    t_start = time.perf_counter()

    def session(p: dict) -> None:
        time.sleep(max(0.0, p["start"] - (time.perf_counter() - t_start)))
        prompt = list(p["first"])
        for k in range(p["turns"]):
            if k > 0:
                time.sleep(p["think"][k])
                prompt += p["messages"][k]
            r = client.complete(prompt, args.answer_tokens)
            r["turn"] = k
            r["prompt_tokens"] = len(prompt)
            with lock:
                records.append(r)
            if r["error"]:
                return
            prompt += p["answers"][k][: max(1, r["tokens"])]

    # Daemon threads: an interrupted run does not wait for requests a stalled server holds.
    threads = [threading.Thread(target=session, args=(p,), daemon=True) for p in plans]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t_start
    ok = [r for r in records if not r["error"]]
    gaps = [g for r in ok for g in r["gaps_ms"]]
    return {
        "config": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "model": client.model,
        "wall_s": wall,
        "requests": len(records),
        "errors": [r["error"] for r in records if r["error"]][:10],
        "n_errors": sum(1 for r in records if r["error"]),
        "ttft_first_ms": stats([r["ttft_ms"] for r in ok if r["turn"] == 0 and r["ttft_ms"] is not None]),
        "ttft_returning_ms": stats([r["ttft_ms"] for r in ok if r["turn"] > 0 and r["ttft_ms"] is not None]),
        "itl_ms": stats(gaps),
        "output_tok_per_s": sum(r["tokens"] for r in ok) / wall if wall > 0 else 0.0,
        "prompt_tokens_mean": statistics.fmean([r["prompt_tokens"] for r in records]) if records else 0,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="base URL ending in /v1")
    ap.add_argument("--model", help="model id (default: the first of GET /models)")
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--rate", type=float, default=0.5, help="session arrivals per second (Poisson)")
    ap.add_argument("--turns", type=parse_range, default=(4, 8))
    ap.add_argument("--system-tokens", type=int, default=256, help="shared system prompt (ids)")
    ap.add_argument("--first-tokens", type=parse_range, default=(1000, 4000), help="first prompt length")
    ap.add_argument("--message-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--think-s", type=float, default=2.0, help="mean think time between turns (exponential)")
    ap.add_argument("--vocab", type=int, default=32000, help="ids are drawn from [10, VOCAB)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--json", help="write the summary here")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 1 if e.code else 0
    import math
    if (args.sessions < 1 or not (0 < args.rate < math.inf) or not (0 <= args.think_s < math.inf)
            or args.vocab <= 10 or args.answer_tokens < 1 or args.message_tokens < 1 or args.system_tokens < 0
            or not (0 < args.request_timeout < math.inf)):
        print("serve_sessions: need --sessions >= 1, finite --rate > 0, finite --think-s >= 0, --vocab > 10, "
              "--answer-tokens >= 1, --message-tokens >= 1, --system-tokens >= 0, --request-timeout > 0",
              file=sys.stderr)
        return 1
    json_file = None
    if args.json:
        try:
            json_file = open(args.json, "w")  # before the run: a bad path costs nothing
        except OSError as e:
            print(f"serve_sessions: --json {args.json}: {e.strerror}", file=sys.stderr)
            return 1
    try:
        summary = run(args)
    except KeyboardInterrupt:
        print("serve_sessions: interrupted", file=sys.stderr)
        return 130
    except (OSError, KeyError, ValueError) as e:
        print(f"serve_sessions: cannot reach the server at {args.url}: {e}", file=sys.stderr)
        return 2
    s = summary
    print(f"{s['requests']} requests ({s['n_errors']} errors) in {s['wall_s']:.1f} s; "
          f"TTFT first p50/p95 {s['ttft_first_ms']['p50']:.0f}/{s['ttft_first_ms']['p95']:.0f} ms, "
          f"returning p50/p95 {s['ttft_returning_ms']['p50']:.0f}/{s['ttft_returning_ms']['p95']:.0f} ms; "
          f"ITL p50/p95/sd {s['itl_ms']['p50']:.2f}/{s['itl_ms']['p95']:.2f}/{s['itl_ms']['stddev']:.2f} ms; "
          f"{s['output_tok_per_s']:.0f} output tok/s")
    if json_file is not None:
        with json_file:
            json.dump(summary, json_file, indent=1)
    if s["n_errors"]:
        print(f"serve_sessions: {s['n_errors']} of {s['requests']} requests failed; first: {s['errors'][0]}",
              file=sys.stderr)
        return 1 if s["requests"] > s["n_errors"] else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
