"""Soak test: many concurrent requests against `flashdllm serve` while faults are injected, then
checks that nothing crashed, hung or leaked, and that every greedy output that was not cancelled
equals a fault-free run's.

The workload: `--requests` requests, `--concurrency` at a time, over prompts that share long
prefixes (so the prefix cache and the KV tiers work), with mixed lengths (max_tokens 4..96),
greedy and seeded sampling, 20% streamed and cancelled mid-stream (the client closes the
connection), 5% malformed (bad JSON, wrong types, out-of-range values, unknown fields).

The server runs with a small device tier, a host tier and a disk tier, the disk tier on a small
filesystem of its own (as root: a size-limited tmpfs mounted for the run; otherwise a plain
directory), and Redis control. While the workload runs, a fault thread injects, in turn:
tier-2 read EIO, write EIO, write ENOSPC, short reads (through `POST /admin/faults`, the
server's `--fault-injection` hook), bit flips in demoted blocks, fills the disk tier's
filesystem to the last byte (a file beside the tier's, removed at the next turn: the tier
reserves its space at start, so it must not notice), and kills `redis-server` and starts it
again.

First the same workload's greedy requests run once with no faults and no cancellations; those
outputs are the reference. At the end: the server is alive and answers /health, no request
hung (each has a deadline), the engine is idle with every KV block free or cached
(`flashdllm_kv_blocks_used` 0, nothing running or waiting), and every greedy request that
completed equals the reference.

Uses the standard library only. Binds to loopback.

  python3 bench/soak.py --flashdllm build/bin/flashdllm [-m MODEL] [--requests 10000]
      [--concurrency 64] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import atexit
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import prometheus_text

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FLASHDLLM_SHARED", REPO.parent / "shared"))
DEFAULT_MODEL = SHARED / "models" / "stories260K.gguf"
REQUEST_DEADLINE_S = 120.0  # a request that takes longer counts as hung

WORDS = ("the little dog ran to the park and saw a big red ball . she was happy and wanted to play "
         "with her friend tom who lived near the old tree by the river").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Req:
    index: int
    kind: str  # "greedy", "sampled", "cancel", "malformed"
    body: bytes
    max_tokens: int = 0


@dataclass
class Outcome:
    index: int
    kind: str
    status: int = 0
    text: str | None = None
    latency_s: float = 0.0
    error: str = ""


def make_workload(n: int, seed: int) -> list[Req]:
    rng = random.Random(seed)
    # 24 documents of 60-200 words: requests share them as prefixes.
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 200))) for _ in range(24)]
    reqs: list[Req] = []
    for i in range(n):
        roll = rng.random()
        prompt = docs[rng.randrange(len(docs))] + f" question {rng.randint(0, 50)}:"
        max_tokens = rng.choice([4, 8, 16, 32, 64, 96])
        if roll < 0.05:
            reqs.append(Req(i, "malformed", malformed_body(rng, prompt)))
            continue
        body = {"prompt": prompt, "max_tokens": max_tokens}
        if roll < 0.25:
            kind = "cancel"
            body.update(stream=True, temperature=0, max_tokens=96)
        elif roll < 0.55:
            kind = "sampled"
            body.update(temperature=rng.choice([0.7, 1.0]), top_p=0.9, seed=rng.randint(0, 1 << 30))
        else:
            kind = "greedy"
            body.update(temperature=0)
        reqs.append(Req(i, kind, json.dumps(body).encode(), max_tokens))
    return reqs


def malformed_body(rng: random.Random, prompt: str) -> bytes:
    choices = [
        b'{"prompt": "unterminated',
        b'[1, 2, 3]',
        json.dumps({"prompt": prompt, "max_tokens": "many"}).encode(),
        json.dumps({"prompt": prompt, "temperature": -3}).encode(),
        json.dumps({"prompt": prompt, "max_tokens": 10**12}).encode(),
        json.dumps({"prompt": 42}).encode(),
        json.dumps({"prompt": prompt, "logit_bias": {"not-a-token": 5}}).encode(),
        json.dumps({"prompt": prompt, "n": 0}).encode(),
        b"\xff\xfe\x00garbage",
        json.dumps({"prompt": prompt, "stop": [{"x": 1}]}).encode(),
    ]
    return rng.choice(choices)


def send(port: int, req: Req, cancel_after: int) -> Outcome:
    out = Outcome(req.index, req.kind)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_DEADLINE_S)
    try:
        conn.request("POST", "/v1/completions", body=req.body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        out.status = resp.status
        if req.kind == "cancel" and resp.status == 200:
            # Read a few events, then hang up mid-stream.
            for _ in range(cancel_after):
                if not resp.fp.readline():
                    break
            conn.sock.shutdown(socket.SHUT_RDWR)
        else:
            data = resp.read()
            if resp.status == 200:
                out.text = json.loads(data)["choices"][0]["text"]
            else:
                json.loads(data)  # every error is a JSON body
    except Exception as e:  # noqa: BLE001 - recorded and judged by the caller
        out.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    out.latency_s = time.perf_counter() - t0
    return out


def run_workload(port: int, reqs: list[Req], concurrency: int, seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    cancel_after = {r.index: rng.randint(1, 6) for r in reqs}
    outcomes: list[Outcome | None] = [None] * len(reqs)
    it = iter(range(len(reqs)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            outcomes[i] = send(port, reqs[i], cancel_after[reqs[i].index])

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=REQUEST_DEADLINE_S * (len(reqs) / concurrency + 2))
    return [o if o is not None else Outcome(reqs[i].index, reqs[i].kind, error="hung") for i, o in enumerate(outcomes)]


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def post(port: int, path: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def metrics(port: int) -> dict[str, float]:
    _, text = get(port, "/metrics")
    return prometheus_text.parse(text.decode())


class Redis:
    """redis-server on loopback, killed and started again by the fault thread."""

    def __init__(self, port: int, workdir: Path):
        self.port, self.workdir, self.proc = port, workdir, None

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def small_filesystem(path: Path, mib: int) -> bool:
    """Mounts a size-limited tmpfs at `path` (root only); False when that is not possible."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


@dataclass
class Faults:
    counts: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)

    def note(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n


def fill_filesystem(path: Path) -> Path | None:
    """Writes a file that takes every free byte of `path`'s filesystem; returns it."""
    filler = path / "filler"
    try:
        with open(filler, "wb") as f:
            chunk = b"\0" * (1 << 16)
            while True:
                f.write(chunk)
                f.flush()
    except OSError:  # ENOSPC: the filesystem is full
        return filler
    return filler


def fault_loop(port: int, redis: Redis | None, stop: threading.Event, faults: Faults, period_s: float,
               disk_dir: Path, disk_fills: bool) -> None:
    kinds = ["disk_read_eio", "flip_bit", "disk_write_eio", "redis_restart", "disk_read_short", "flip_bit",
             "disk_write_enospc"]
    if disk_fills:
        kinds.append("filesystem_full")
    filler: Path | None = None
    i = 0
    while not stop.wait(period_s):
        kind = kinds[i % len(kinds)]
        i += 1
        if filler is not None:  # the filesystem stayed full for one period
            filler.unlink(missing_ok=True)
            filler = None
        if kind == "filesystem_full":
            filler = fill_filesystem(disk_dir)
            faults.note(kind)
            continue
        if kind == "redis_restart":
            if redis is None:
                continue
            redis.kill()
            time.sleep(0.3)
            redis.start()
            faults.note(kind)
            continue
        try:
            status, body = post(port, "/admin/faults", {"fault": kind, "count": 2})
        except OSError:
            continue
        if status == 200:
            faults.note(kind, int(body.get("applied", 0)))
        else:
            faults.refused[kind] = faults.refused.get(kind, 0) + 1


def start_server(args, port: int, disk_dir: Path, redis_port: int | None, fault_injection: bool) -> subprocess.Popen:
    cmd = [args.flashdllm, "serve", "-m", str(args.model), "--host", "127.0.0.1", "--port", str(port), "-c", "512",
           "--max-num-seqs", str(args.max_num_seqs), "--kv-tier0-bytes", str(args.tier0_kib * 1024),
           "--kv-host-bytes", str(args.host_kib * 1024), "--kv-disk-path", str(disk_dir),
           "--kv-disk-bytes", str(args.disk_mib * 1024 * 1024), "--kv-placement", "disk", "-t", str(args.threads)]
    if redis_port is not None:
        cmd += ["--control-redis", f"redis://127.0.0.1:{redis_port}/flashdllm-control"]
    if fault_injection:
        cmd.append("--fault-injection")
    log = open(args.workdir / ("server-faults.log" if fault_injection else "server-clean.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited at start (status {proc.returncode}); see {log.name}")
        try:
            if get(port, "/health")[0] == 200:
                return proc
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the server did not answer /health within 60 s")


def stop_server(proc: subprocess.Popen) -> int | None:
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashdllm", default=str(REPO / "build" / "bin" / "flashdllm"))
    ap.add_argument("-m", "--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--tier0-kib", type=int, default=2048, help="device (pool) tier size")
    ap.add_argument("--host-kib", type=int, default=2048)
    ap.add_argument("--disk-mib", type=int, default=4, help="the disk tier's budget")
    ap.add_argument("--disk-fs-mib", type=int, default=8, help="size of the disk tier's own filesystem")
    ap.add_argument("--fault-period", type=float, default=0.5, help="seconds between injected faults")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.workdir = Path(tempfile.mkdtemp(prefix="flashdllm-soak-"))
    reqs = make_workload(args.requests, args.seed)
    kinds = {k: sum(r.kind == k for r in reqs) for k in ("greedy", "sampled", "cancel", "malformed")}
    print(f"workload: {args.requests} requests {kinds}, {args.concurrency} concurrent; work dir {args.workdir}",
          flush=True)
    failures: list[str] = []

    # 1. The reference: the greedy requests, no faults, no cancellations.
    port = free_port()
    clean_disk = args.workdir / "disk-clean"
    clean_disk.mkdir()
    server = start_server(args, port, clean_disk, None, False)
    greedy = [r for r in reqs if r.kind == "greedy"]
    t0 = time.perf_counter()
    ref = {o.index: o for o in run_workload(port, greedy, args.concurrency, args.seed)}
    print(f"reference: {len(greedy)} greedy requests in {time.perf_counter() - t0:.1f} s", flush=True)
    stop_server(server)
    bad_ref = [o for o in ref.values() if o.status != 200 or o.text is None]
    if bad_ref:
        raise SystemExit(f"{len(bad_ref)} reference requests failed, e.g. {bad_ref[0]}")

    # 2. The soak, with faults.
    disk_dir = args.workdir / "disk"
    disk_fills = small_filesystem(disk_dir, args.disk_fs_mib)
    if disk_fills:  # unmounted however the run ends (an early exit included)
        atexit.register(subprocess.run, ["umount", "-l", str(disk_dir)], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    redis = None
    redis_port = None
    if shutil.which("redis-server"):
        redis_port = free_port()
        redis = Redis(redis_port, args.workdir)
        redis.start()
        atexit.register(redis.kill)
    port = free_port()
    server = start_server(args, port, disk_dir, redis_port, True)
    start_metrics = metrics(port)
    faults = Faults()
    stop = threading.Event()
    injector = threading.Thread(target=fault_loop,
                                args=(port, redis, stop, faults, args.fault_period, disk_dir, disk_fills), daemon=True)
    injector.start()
    t0 = time.perf_counter()
    outcomes = run_workload(port, reqs, args.concurrency, args.seed + 1)
    elapsed = time.perf_counter() - t0
    stop.set()
    injector.join(timeout=30)

    # 3. Checks.
    alive = server.poll() is None
    if not alive:
        failures.append(f"the server died (status {server.returncode})")
    health = get(port, "/health")[0] if alive else 0
    if alive and health != 200:
        failures.append(f"/health answered {health}")
    hung = [o for o in outcomes if o.error == "hung" or (o.error and "timed out" in o.error)]
    if hung:
        failures.append(f"{len(hung)} requests hung, e.g. #{hung[0].index} ({hung[0].kind})")
    idle = {}
    if alive:
        deadline = time.time() + 30  # cancelled streams end at their next step
        while time.time() < deadline:
            idle = metrics(port)
            if idle.get("flashdllm_requests_running", 1) == 0 and idle.get("flashdllm_requests_waiting", 1) == 0:
                break
            time.sleep(0.2)
        for key in ("flashdllm_requests_running", "flashdllm_requests_waiting", "flashdllm_kv_blocks_used"):
            if idle.get(key, -1) != start_metrics.get(key, 0):
                failures.append(f"{key} is {idle.get(key)} after the soak, {start_metrics.get(key)} before")
    mismatched = []
    greedy_done = 0
    for o in outcomes:
        if o.kind == "greedy" and o.status == 200 and o.text is not None:
            greedy_done += 1
            if o.text != ref[o.index].text:
                mismatched.append(o.index)
        elif o.kind == "greedy":
            failures.append(f"greedy request #{o.index} failed: status {o.status} {o.error}")
        elif o.kind == "sampled" and (o.status != 200 or o.error):
            failures.append(f"sampled request #{o.index} failed: status {o.status} {o.error}")
        elif o.kind == "malformed" and not (400 <= o.status < 500):
            failures.append(f"malformed request #{o.index} got status {o.status} {o.error}")
    if mismatched:
        failures.append(f"{len(mismatched)} greedy outputs differ from the fault-free run, e.g. #{mismatched[0]}")
    code = stop_server(server)
    if code not in (None, 0):
        failures.append(f"the server exited with status {code} at shutdown")

    lat = sorted(o.latency_s for o in outcomes if o.kind in ("greedy", "sampled") and o.status == 200)
    summary = {
        "requests": len(reqs), "kinds": kinds, "concurrency": args.concurrency, "seconds": elapsed,
        "completed_greedy": greedy_done, "greedy_identical": greedy_done - len(mismatched),
        "cancelled": sum(o.kind == "cancel" for o in outcomes),
        "malformed_refused": sum(o.kind == "malformed" and 400 <= o.status < 500 for o in outcomes),
        "faults": faults.counts, "faults_refused": faults.refused, "disk_filesystem_fills": disk_fills,
        "p50_latency_s": statistics.median(lat) if lat else None,
        "p95_latency_s": lat[int(0.95 * (len(lat) - 1))] if lat else None,
        "checksum_failures": {k: v for k, v in idle.items() if k.startswith("flashdllm_kv_tier_checksum_failures_total")},
        "blocks_moved": {k: v for k, v in idle.items() if k.startswith("flashdllm_kv_blocks_moved_total")},
        "failures": failures,
    }
    print(json.dumps(summary, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    if redis:
        redis.kill()
    if disk_fills:
        subprocess.run(["umount", str(disk_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not failures:
        shutil.rmtree(args.workdir, ignore_errors=True)
    print("soak: " + ("PASS" if not failures else f"FAIL ({len(failures)} problems; logs in {args.workdir})"))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
