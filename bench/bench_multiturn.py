#!/usr/bin/env python3
"""Multi-turn KV tiering benchmark: returning-turn TTFT and total time for

  recompute   tier 0 only: evicted prefix-cache blocks are dropped and recomputed
  host        tier 1 (host DRAM) under tier 0 (--kv-placement host)
  host+disk   tier 1, ageing to tier 2 (disk, O_DIRECT + io_uring)   (--kv-placement disk)
  auto        the same tiers; each block placed by the cost rule over the measured storage
              profile and the model's measured prefill speed      (--kv-placement auto)

on the same workload (`flashdllm multiturn`: S sessions x T turns; a returning turn's prompt
is the previous prompt + answer + a new message, so its leading blocks hit the prefix cache
wherever they now live). Tier 0 is sized so that the sessions' contexts together exceed it
--oversubscribe times; tier 1 holds --host-fraction of the working set, tier 2 all of it.

Configurations run one at a time, interleaved round by round (-r rounds, the order rotated
each round), so slow drift of a shared machine hits all alike; the median over rounds is
reported. Use -r 4 or more (a multiple of 4 gives every configuration every position). The
acceptance check: auto is never slower than the best fixed choice by more than 10% (total
time and mean returning-turn TTFT). Exit status 1 when it is.

Usage (repository root, build/bin/flashdllm built, machine otherwise idle):
  python3 bench/bench_multiturn.py                      # codelm-16m and the 110m preset
  python3 bench/bench_multiturn.py --models ../shared/models/codelm-16m-f16.gguf -r 1 \\
      --sessions=8 --turns 3                            # a quick smoke run
The 110m preset: build/bin/flashdllm tools make-model --preset 110m --dtype f16 \\
  --vocab-from ../shared/llama-cpp-vocab-fixtures/ggml-vocab-llama-spm.gguf -o models/bench-110m-f16.gguf
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

CONFIGS = ["recompute", "host", "host+disk", "auto"]


def run(cmd: list[str]) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr.strip()}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def workload_args(a) -> list[str]:
    return ["--sessions", str(a.sessions), "--turns", str(a.turns), "--first-tokens",
            str(a.first_tokens), "--message-tokens", str(a.message_tokens), "--answer-tokens",
            str(a.answer_tokens), "--max-num-seqs", str(a.max_num_seqs), "-t", str(a.threads),
            "--block-size", str(a.block_size)]


def config_args(name: str, tier0: int, host: int, disk: int, disk_dir: str,
                cache_dir: str) -> list[str]:
    args = ["--kv-tier0-bytes", str(tier0), "--kv-profile-cache", cache_dir]
    if name == "recompute":
        return args + ["--kv-placement", "recompute"]
    args += ["--kv-host-bytes", str(host)]
    if name == "host":
        return args + ["--kv-placement", "host"]
    args += ["--kv-disk-bytes", str(disk), "--kv-disk-path", disk_dir]
    return args + ["--kv-placement", "disk" if name == "host+disk" else "auto"]


def bench_model(a, model: str) -> tuple[list[dict], bool]:
    base = [a.bin, "multiturn", "-m", model] + workload_args(a)
    # Probe: block bytes and the working set (blocks all sessions' last turns need).
    probe = run(base[:4] + ["--sessions", "1", "--turns", str(a.turns), "--first-tokens",
                            str(a.first_tokens), "--message-tokens", str(a.message_tokens),
                            "--answer-tokens", "1", "-t", str(a.threads), "--block-size",
                            str(a.block_size)])
    block = probe["block_bytes"]
    n_ctx_blocks = -(-(a.first_tokens + (a.turns - 1) * (a.answer_tokens + a.message_tokens)
                       + a.answer_tokens) // a.block_size)
    working = a.sessions * n_ctx_blocks
    tier0_blocks = max(n_ctx_blocks, working // a.oversubscribe)
    tier0 = tier0_blocks * block
    host = max(1, int(working * a.host_fraction)) * block
    disk = 2 * working * block
    disk_dir = tempfile.mkdtemp(prefix="fdl-bench-mt-", dir=a.disk_dir)
    cache_dir = os.path.join(disk_dir, "profile-cache")
    runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    try:
        # Warm-up: auto measures (and caches) the storage profile at start-up; do it before
        # any timed run, so its 256 MiB of disk traffic does not disturb one.
        run(base[:4] + ["--sessions", "1", "--turns", "1", "--first-tokens", str(a.first_tokens),
                        "--answer-tokens", "1", "-t", str(a.threads), "--block-size",
                        str(a.block_size)] + config_args("auto", tier0, host, disk, disk_dir, cache_dir))
        for r in range(a.rounds):
            # Rotate the order each round: no configuration always runs right after another.
            for c in CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]:
                j = run(base + config_args(c, tier0, host, disk, disk_dir, cache_dir))
                runs[c].append(j)
                print(f"  {os.path.basename(model)} round {r + 1} {c:10s} total {j['total_ms']:9.1f} ms"
                      f"  returning TTFT mean {j['ttft_returning_ms']['mean']:8.2f} ms", file=sys.stderr)
    finally:
        shutil.rmtree(disk_dir, ignore_errors=True)
    rows = []
    for c in CONFIGS:
        js = runs[c]
        last = js[-1]
        moved = {k: v["bytes"] for k, v in last["kv_tiers"]["tiers"].get("moved", {}).items()}
        rows.append({
            "model": os.path.basename(model), "config": c,
            "total_ms": statistics.median(j["total_ms"] for j in js),
            "ttft_return_mean_ms": statistics.median(j["ttft_returning_ms"]["mean"] for j in js),
            "ttft_return_p95_ms": statistics.median(j["ttft_returning_ms"]["p95"] for j in js),
            "cached_fraction": last["returning_cached_fraction"],
            "prefill_computed": last["prefill_tokens_computed"],
            "bytes_moved": moved,
            "demoted_host": last["kv_tiers"]["demoted_host"],
            "demoted_disk": last["kv_tiers"]["demoted_disk"],
            "dropped": last["kv_tiers"]["dropped"],
            "promoted": last["kv_tiers"]["promoted"],
            "recompute_tok_per_s": last["kv_tiers"]["recompute_tok_per_s"],
            "profile": last.get("profile"),
            "tier0_blocks": last["tier0_blocks"], "working_set_blocks": last["working_set_blocks"],
            "block_bytes": block,
        })
    fixed = [r for r in rows if r["config"] != "auto"]
    auto = next(r for r in rows if r["config"] == "auto")
    ok = True
    for key in ("total_ms", "ttft_return_mean_ms"):
        best = min(r[key] for r in fixed)
        if auto[key] > 1.10 * best:
            ok = False
            print(f"  {auto['model']}: auto {key} {auto[key]:.1f} > 1.10 x best fixed {best:.1f}",
                  file=sys.stderr)
    return rows, ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="build/bin/flashdllm")
    p.add_argument("--models", nargs="+", default=["../shared/models/codelm-16m-f16.gguf",
                                                   "models/bench-110m-f16.gguf"])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--first-tokens", type=int, default=256)
    p.add_argument("--message-tokens", type=int, default=32)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--oversubscribe", type=int, default=4,
                   help="working set / tier 0 (contexts together exceed tier 0 this many times)")
    p.add_argument("--host-fraction", type=float, default=0.5,
                   help="tier 1 size as a fraction of the working set")
    p.add_argument("--disk-dir", default=None, help="parent of the tier-2 directory (default: $TMPDIR)")
    p.add_argument("-r", "--rounds", type=int, default=4)
    p.add_argument("--json", help="also write all rows to this file")
    a = p.parse_args()

    all_rows, all_ok = [], True
    for m in a.models:
        if not os.path.exists(m):
            sys.exit(f"model {m} not found (see --help for the 110m preset)")
        rows, ok = bench_model(a, m)
        all_rows += rows
        all_ok = all_ok and ok
    print(f"\n{'model':24s} {'config':10s} {'total ms':>10s} {'ret TTFT mean':>14s} {'p95':>9s} "
          f"{'cached':>7s} {'prefill':>8s} {'t0->1 MB':>9s} {'1->2 MB':>8s} {'0->2 MB':>8s} "
          f"{'->0 MB':>8s}")
    for r in all_rows:
        mv = r["bytes_moved"]
        mb = lambda k: mv.get(k, 0) / 1e6
        back = mb("host_to_device") + mb("disk_to_device")
        print(f"{r['model']:24s} {r['config']:10s} {r['total_ms']:10.1f} {r['ttft_return_mean_ms']:14.2f} "
              f"{r['ttft_return_p95_ms']:9.2f} {r['cached_fraction']:7.2f} {r['prefill_computed']:8d} "
              f"{mb('device_to_host'):9.1f} {mb('host_to_disk'):8.1f} {mb('device_to_disk'):8.1f} {back:8.1f}")
    for r in all_rows:
        if r["config"] == "auto" and r["profile"]:
            pr = r["profile"]
            h, d = pr.get("host", {}), pr.get("disk", {})
            print(f"profile ({r['model']}, measured {pr.get('measured_at')}): host {h.get('write_gbps', 0):.2f}/"
                  f"{h.get('read_gbps', 0):.2f} GB/s, disk {d.get('write_gbps', 0):.2f}/{d.get('read_gbps', 0):.2f} GB/s "
                  f"block read {d.get('read_block_latency_us', 0):.0f} us (direct I/O {d.get('direct_io')}), "
                  f"recompute {pr.get('recompute', {}).get('tokens_per_s', 0):.0f} tok/s (live "
                  f"{r['recompute_tok_per_s']:.0f}); tier 0 {r['tier0_blocks']} blocks, working set "
                  f"{r['working_set_blocks']} blocks of {r['block_bytes']} bytes")
    print("auto within 10% of the best fixed choice:", "yes" if all_ok else "NO")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(all_rows, f, indent=1)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
