#!/usr/bin/env python3
"""Serving benchmark: flashdllm's scheduler settings and llama.cpp's server, same
workload, same run.

Each configuration starts its server on 127.0.0.1, runs bench/loadgen.py against it with the
same seed (hence the same requests at the same arrival times), stops the server, and moves on;
one server at a time, so they never compete for the cores. Configurations:

  flashdllm            length buckets on, prefix cache on (the defaults)
  flashdllm-fcfs       --no-length-buckets (first-come first-served admission)
  flashdllm-noprefix   --no-prefix-cache
  llama.cpp            llama-cpp-python's OpenAI server (bench/peer_llamacpp_server.sh)

Reported per configuration: TTFT p50/p95/p99 of short requests and of all requests, ITL
p50/p95 and stddev, output tok/s, completed req/s, errors; then the target ratios:
short-request p95 TTFT FCFS / buckets (target >= 2x at equal throughput), and
flashdllm vs llama.cpp on p95 TTFT and throughput.

Usage (repository root, build/bin/flashdllm built, `pip install 'llama-cpp-python[server]'`):
  python3 bench/bench_server.py --rate 3 --duration 60 --update-doc docs/BENCHMARKS.md
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("FLASHDLLM_SHARED", REPO.parent / "shared"))


def wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not come up in {timeout_s} s")


def start_flashdllm(args, extra: list[str], port: int) -> subprocess.Popen:
    cmd = [args.bin, "serve", "-m", args.model, "--host", "127.0.0.1",
           "--port", str(port), "-t", str(args.threads), "--ctx-size", str(args.ctx_size),
           "--max-num-seqs", str(args.max_num_seqs)] + extra
    log = open(f"/tmp/bench_server_flashdllm_{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proc.cmdline = " ".join(cmd)  # type: ignore[attr-defined]
    return proc


def start_llamacpp(args, port: int) -> subprocess.Popen:
    # Same settings as the peer script, started here so that we own the process.
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", args.model, "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(args.ctx_size), "--n_threads", str(args.threads),
           "--interrupt_requests", "False"]
    log = open(f"/tmp/bench_server_llamacpp_{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proc.cmdline = " ".join(cmd)  # type: ignore[attr-defined]
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_loadgen(args, url: str, out_json: Path) -> dict:
    cmd = [sys.executable, str(REPO / "bench/loadgen.py"), "--url", url, "--rate", str(args.rate),
           "--duration", str(args.duration), "--short-frac", str(args.short_frac),
           "--short-prompt", args.short_prompt, "--long-prompt", args.long_prompt,
           "--output-tokens", args.output_tokens, "--shared-prefix-frac", str(args.shared_frac),
           "--shared-prefix-tokens", str(args.shared_prefix_tokens), "--seed", str(args.seed),
           "--ignore-eos", "--json", str(out_json), "--quiet"]
    subprocess.run(cmd, check=False)
    return json.loads(out_json.read_text())


def row(name: str, rec: dict) -> dict:
    s = rec["summary"]
    c_all, c_short = s["classes"]["all"], s["classes"]["short"]
    g = lambda c, m, k: c[m].get(k, float("nan"))  # noqa: E731
    return {
        "config": name,
        "short_ttft_p50": g(c_short, "ttft_ms", "p50"), "short_ttft_p95": g(c_short, "ttft_ms", "p95"),
        "short_ttft_p99": g(c_short, "ttft_ms", "p99"),
        "ttft_p50": g(c_all, "ttft_ms", "p50"), "ttft_p95": g(c_all, "ttft_ms", "p95"),
        "ttft_p99": g(c_all, "ttft_ms", "p99"),
        "itl_p50": g(c_all, "itl_ms", "p50"), "itl_p95": g(c_all, "itl_ms", "p95"),
        "itl_std": g(c_all, "itl_ms", "stddev"),
        "tok_s": s["throughput"]["output_tok_per_s"], "req_s": s["throughput"]["req_per_s"],
        "ok": c_all["ok"], "requests": c_all["requests"],
    }


def markdown(rows: list[dict], args, cmdlines: dict) -> str:
    by = {r["config"]: r for r in rows}
    lines = ["| config | short TTFT p50 / p95 / p99 (ms) | all TTFT p50 / p95 / p99 (ms) | "
             "ITL p50 / p95 (ms) | ITL σ (ms) | output tok/s | req/s | ok |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['short_ttft_p50']:.0f} / {r['short_ttft_p95']:.0f} / "
            f"{r['short_ttft_p99']:.0f} | {r['ttft_p50']:.0f} / {r['ttft_p95']:.0f} / "
            f"{r['ttft_p99']:.0f} | {r['itl_p50']:.1f} / {r['itl_p95']:.1f} | {r['itl_std']:.1f} | "
            f"{r['tok_s']:.1f} | {r['req_s']:.2f} | {r['ok']}/{r['requests']} |")
    out = ["", "\n".join(lines), ""]
    f, fc = by.get("flashdllm"), by.get("flashdllm-fcfs")
    if f and fc:
        out.append(f"- Length buckets: short-request p95 TTFT FCFS / buckets = "
                   f"**{fc['short_ttft_p95'] / f['short_ttft_p95']:.2f}×** (target ≥ 2×) at "
                   f"throughput {f['tok_s']:.1f} vs {fc['tok_s']:.1f} tok/s.")
    fn = by.get("flashdllm-noprefix")
    if f and fn:
        out.append(f"- Prefix cache: all-request p95 TTFT without / with = "
                   f"{fn['ttft_p95'] / f['ttft_p95']:.2f}×; throughput {fn['tok_s']:.1f} → "
                   f"{f['tok_s']:.1f} tok/s.")
    l = by.get("llama.cpp")
    if f and l:
        out.append(f"- vs llama.cpp: p95 TTFT llama.cpp / flashdllm = "
                   f"**{l['ttft_p95'] / f['ttft_p95']:.2f}×**, short p95 TTFT "
                   f"{l['short_ttft_p95'] / f['short_ttft_p95']:.2f}×, throughput flashdllm / "
                   f"llama.cpp = **{f['tok_s'] / l['tok_s']:.2f}×**.")
    out.append("")
    out.append("Server command lines:")
    for name, c in cmdlines.items():
        out.append(f"- {name}: `{c}`")
    return "\n".join(out) + "\n"


def update_doc(path: Path, body: str, header: str) -> None:
    begin, end = "<!-- bench_server:begin -->", "<!-- bench_server:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{header}{body}{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n## Serving: scheduler settings and llama.cpp's server\n\n" + block + "\n"
    path.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "build/bin/flashdllm"), help="flashdllm binary")
    ap.add_argument("--model", default=str(SHARED / "models/codelm-16m-f16.gguf"))
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--short-frac", type=float, default=0.8)
    ap.add_argument("--short-prompt", default="20-60")
    ap.add_argument("--long-prompt", default="300-400")
    ap.add_argument("--output-tokens", default="16-48")
    ap.add_argument("--shared-frac", type=float, default=0.3)
    ap.add_argument("--shared-prefix-tokens", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--configs", default="flashdllm,flashdllm-fcfs,flashdllm-noprefix,llama.cpp")
    ap.add_argument("--out-dir", default=str(REPO / "bench/out"))
    ap.add_argument("--update-doc", metavar="MD")
    args = ap.parse_args()

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = {"flashdllm": [], "flashdllm-fcfs": ["--no-length-buckets"],
             "flashdllm-noprefix": ["--no-prefix-cache"]}
    rows, cmdlines = [], {}
    for i, name in enumerate(args.configs.split(",")):
        port = 18600 + i
        proc = start_llamacpp(args, port) if name == "llama.cpp" else start_flashdllm(args, flags[name], port)
        cmdlines[name] = proc.cmdline  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{port}/v1"
        try:
            wait_ready(url, 120)
            rec = run_loadgen(args, url, out_dir / f"server_{name}.json")
        finally:
            stop(proc)
        r = row(name, rec)
        rows.append(r)
        print(f"{name}: short TTFT p95 {r['short_ttft_p95']:.0f} ms, all TTFT p95 "
              f"{r['ttft_p95']:.0f} ms, ITL p50 {r['itl_p50']:.1f} ms, {r['tok_s']:.1f} tok/s, "
              f"ok {r['ok']}/{r['requests']}", flush=True)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    header = (f"Command: `python3 bench/bench_server.py {' '.join(sys.argv[1:])}` — commit {commit}, "
              f"{os.cpu_count()} cores ({cpu}), model {Path(args.model).name}. Workload (loadgen, seed "
              f"{args.seed}): Poisson {args.rate} req/s for {args.duration} s, {args.short_frac:.0%} short "
              f"({args.short_prompt} words) / long ({args.long_prompt} words), {args.shared_frac:.0%} with a "
              f"{args.shared_prefix_tokens}-word shared prefix, {args.output_tokens} output tokens, "
              f"temperature 0, EOS ignored; times measured by the client.\n")
    body = markdown(rows, args, cmdlines)
    print(header + body)
    if args.update_doc:
        update_doc(Path(args.update_doc), body, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
