#!/usr/bin/env python3
"""What a flood of /metrics requests costs the generation: `flashdllm serve` on loopback,
N concurrent completions, first alone, then while P threads poll /metrics at H Hz each.
Reports generation tok/s both ways and the /metrics latency (p50, p99, max).

  python3 bench/bench_metrics_flood.py --cli build/bin/flashdllm [--cli2 OTHER_BINARY]
      [--model M.gguf] [--streams 4] [--tokens 200] [--pollers 50] [--hz 20] [--rounds 3]

Without --model a slow random model is generated once (tools make-model, dim 512, 8 layers),
so one step takes a few milliseconds on one thread. With --cli2 both binaries run in
alternation, round by round, so machine noise hits both alike. Only 127.0.0.1 is used.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def make_model(cli: str, path: Path) -> None:
    subprocess.run([cli, "tools", "make-model", "-o", str(path), "--preset", "tiny", "--dim", "512", "--n-layers",
                    "8", "--n-heads", "8", "--n-kv-heads", "8", "--ffn-dim", "1536", "--context", "4096", "--dtype",
                    "f16", "-t", "2"], check=True, capture_output=True)


class Server:
    def __init__(self, cli: str, model: str):
        self.proc = subprocess.Popen([cli, "serve", "-m", model, "--port", "0", "-t", "1", "--max-num-seqs", "8"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.port = None
        deadline = time.time() + 60
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"{cli} serve did not start")
                continue
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for _ in self.proc.stderr:
            pass

    def post(self, path: str, body: dict, timeout: float = 300.0) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}: {data[:200]!r}")
        return json.loads(data)

    def get(self, path: str, timeout: float = 30.0) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        conn.close()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def generate(server: Server, streams: int, tokens: int) -> float:
    """tok/s of `streams` concurrent greedy completions of `tokens` tokens each."""
    done = []

    def one(i: int):
        r = server.post("/v1/completions", {"prompt": f"Request {i}: once upon a time", "max_tokens": tokens,
                                            "temperature": 0, "ignore_eos": True})
        done.append(r["usage"]["completion_tokens"])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def flood(server: Server, pollers: int, hz: float, stop: threading.Event, lat_ms: list):
    def poll():
        period = 1.0 / hz
        while not stop.is_set():
            t0 = time.perf_counter()
            server.get("/metrics")
            dt = time.perf_counter() - t0
            lat_ms.append(dt * 1e3)
            time.sleep(max(0.0, period - dt))

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(pollers)]
    for t in threads:
        t.start()
    return threads


def pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_round(cli: str, model: str, a) -> dict:
    server = Server(cli, model)
    try:
        generate(server, a.streams, 16)  # warm-up
        alone = generate(server, a.streams, a.tokens)
        lat: list = []
        stop = threading.Event()
        threads = flood(server, a.pollers, a.hz, stop, lat)
        time.sleep(0.5)
        flooded = generate(server, a.streams, a.tokens)
        stop.set()
        for t in threads:
            t.join()
        return {"alone": alone, "flooded": flooded, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "max": max(lat),
                "polls": len(lat)}
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--cli2", help="a second binary, run in alternation with --cli")
    ap.add_argument("--model")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--pollers", type=int, default=50)
    ap.add_argument("--hz", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    model = a.model
    if not model:
        model = str(Path(tempfile.gettempdir()) / "fdl_metrics_flood_model.gguf")
        if not Path(model).exists():
            make_model(a.cli, Path(model))
    clis = [a.cli] + ([a.cli2] if a.cli2 else [])
    results = {c: [] for c in clis}
    for r in range(a.rounds):
        for c in clis:
            res = run_round(c, model, a)
            results[c].append(res)
            print(f"round {r} {c}: alone {res['alone']:.0f} tok/s, flooded {res['flooded']:.0f} tok/s "
                  f"({res['flooded'] / res['alone']:.2f}x), /metrics p50 {res['p50']:.1f} ms p99 {res['p99']:.1f} ms "
                  f"max {res['max']:.1f} ms ({res['polls']} polls)", flush=True)
    print("\n| binary | tok/s alone | tok/s flooded | ratio | /metrics p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in clis:
        rs = results[c]
        med = lambda k: statistics.median(x[k] for x in rs)
        ratio = statistics.median(x["flooded"] / x["alone"] for x in rs)
        print(f"| {c} | {med('alone'):.0f} | {med('flooded'):.0f} | {ratio:.2f}x | {med('p50'):.1f} | "
              f"{med('p99'):.1f} | {med('max'):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
