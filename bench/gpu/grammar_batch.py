"""What a JSON schema costs a full batch: N concurrent requests through `flashdllm serve`, once
with `response_format` json_schema and once without, same prompts, same max_tokens, greedy.

Per run it reports the wall time, completion tokens per second, engine steps, tokens per
forward and, from /metrics, the host time the engine spent on grammar masks and drafts
(`flashdllm_grammar_seconds_total`): its share of the run's wall time is the share of the
step time that grammar work takes, since the engine steps back to back while N requests are
running. The constrained outputs are parsed as JSON and checked against the schema's required
keys (those cut by max_tokens excepted). The first full-length constrained round computes the
masks of most of the schema's states (cached for every later request with the schema); the
summary gives its share apart from the median of the rounds after it, the steady state.

Uses only the standard library (it runs on the GPU machine), binds to loopback.

  python3 bench/gpu/grammar_batch.py --flashdllm BIN -m MODEL [--device cuda] [-n 64]
      [--max-tokens 192] [--rounds 3] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import prometheus_text  # noqa: E402 - bench/, beside this folder

# A record with long fixed keys and enums (much of it forced by the schema) and free fields.
SCHEMA = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 99999},
        "customer_full_legal_name": {"type": "string", "maxLength": 24},
        "preferred_contact_channel": {"enum": ["electronic_mail", "telephone_call", "postal_letter"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "has_accepted_terms_and_conditions": {"type": "boolean"},
    },
    "required": ["customer_identification_number", "customer_full_legal_name", "preferred_contact_channel",
                 "tags", "has_accepted_terms_and_conditions"],
    "additionalProperties": False,
}


def metrics(base: str) -> dict[str, float]:
    return prometheus_text.parse(urllib.request.urlopen(base + "/metrics", timeout=30).read().decode())


def post(base: str, body: dict) -> dict:
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())


def run(base: str, n: int, max_tokens: int, constrained: bool) -> dict:
    bodies = []
    for i in range(n):
        body = {"prompt": f"Customer record number {i} as JSON:\n", "max_tokens": max_tokens, "temperature": 0}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
        else:
            body["ignore_eos"] = True
        bodies.append(body)
    results: list[dict | None] = [None] * n
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            results[i] = post(base, bodies[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"request {i}: {e}")

    before = metrics(base)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = metrics(base)
    if errors:
        raise SystemExit("; ".join(errors[:5]))
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    tokens = sum(r["usage"]["completion_tokens"] for r in results if r)
    finished = valid = 0
    if constrained:  # outputs cut by max_tokens are not whole JSON; the others must be
        for r in results:
            if r["choices"][0].get("finish_reason") != "stop":
                continue
            finished += 1
            try:
                obj = json.loads(r["choices"][0]["text"])
                valid += int(isinstance(obj, dict) and all(k in obj for k in SCHEMA["required"]))
            except ValueError:
                pass
    steps = delta.get("flashdllm_engine_steps_total", 0.0)
    grammar_s = delta.get("flashdllm_grammar_seconds_total", 0.0)
    return {
        "constrained": constrained, "requests": n, "wall_s": wall, "completion_tokens": tokens,
        "tok_per_s": tokens / wall, "engine_steps": steps, "tokens_per_step": tokens / steps if steps else 0.0,
        "grammar_s": grammar_s, "grammar_share": grammar_s / wall, "grammar_rows": delta.get("flashdllm_grammar_rows_total", 0.0),
        "forced_drafted": delta.get("flashdllm_grammar_forced_drafted_tokens_total", 0.0),
        "forced_accepted": delta.get("flashdllm_grammar_forced_accepted_tokens_total", 0.0),
        "finished": finished if constrained else None, "valid": valid if constrained else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashdllm", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("-n", "--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=3, help="rounds after the warm-up (the first meets the schema's states)")
    ap.add_argument("--json")
    args = ap.parse_args()

    cmd = [args.flashdllm, "serve", "-m", args.model, "--device", args.device, "--host", "127.0.0.1", "--port", "0",
           "--max-num-seqs", str(args.requests), "--max-num-batched-tokens", str(max(512, 2 * args.requests)),
           "-c", "1024"]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    base = None
    try:
        for line in server.stderr:
            sys.stderr.write(line)
            m = re.search(r"listening on (http://[0-9.]+:[0-9]+)", line)
            if m:
                base = m.group(1)
                break
        if base is None:
            raise SystemExit("the server did not start")
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
        run(base, args.requests, 16, True)  # warm-up: graphs, the schema's masks
        run(base, args.requests, 16, False)
        rows = []
        for _ in range(args.rounds):
            for constrained in (False, True):
                r = run(base, args.requests, args.max_tokens, constrained)
                rows.append(r)
                print(json.dumps(r), flush=True)
        median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        constrained = [r for r in rows if r["constrained"]]
        # The first full-length round meets most of the schema's states for the first time
        # (a string's every length, say): their masks are computed then and cached for every
        # later request with the schema. The rounds after it show the steady state.
        warm = constrained[1:] or constrained
        summary = {"plain_tok_per_s": median([r["tok_per_s"] for r in rows if not r["constrained"]]),
                   "schema_tok_per_s": median([r["tok_per_s"] for r in warm]),
                   "grammar_share_first": constrained[0]["grammar_share"],
                   "grammar_share_median": median([r["grammar_share"] for r in warm]),
                   "grammar_us_per_row": median([1e6 * r["grammar_s"] / max(r["grammar_rows"], 1) for r in warm]),
                   "rows": rows}
        print(f"batch {args.requests}: plain {summary['plain_tok_per_s']:.0f} tok/s, schema "
              f"{summary['schema_tok_per_s']:.0f} tok/s, grammar host time {100 * summary['grammar_share_median']:.2f}% "
              f"of the wall time ({summary['grammar_us_per_row']:.1f} us a row; first round with the schema "
              f"{100 * summary['grammar_share_first']:.2f}%)", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=1))
        bad = [r for r in rows if r["constrained"] and r["valid"] != r["finished"]]
        return 1 if bad else 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
