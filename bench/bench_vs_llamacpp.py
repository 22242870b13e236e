#!/usr/bin/env python3
"""Side-by-side prefill (pp) and decode (tg) throughput of flashdllm and llama.cpp.

For each model, in one run, this script alternates rounds of
  * `flashdllm bench --json` (its own warm-up, then -r repetitions), and
  * the same workload on llama.cpp through the llama-cpp-python low-level API,
so that slow drift of the machine (thermal state, other load) hits both engines alike.

Workload, identical for both engines (see docs/BENCHMARKS.md):
  pp: one forward over P prompt tokens in a fresh KV cache, logits for the last token only,
      then a greedy (argmax) pick of the first generated token;
  tg: N single-token forwards, each fed the previous greedy token (EOS ignored).
The P prompt ids are the ones `flashdllm bench` reports (uniform over the vocab from
std::mt19937_64(--seed)), so both engines see exactly the same tokens.

Usage (from the repository root, after building build/bin/flashdllm):
  python3 bench/bench_vs_llamacpp.py                      # stories260K + a 110m F16 model
  python3 bench/bench_vs_llamacpp.py --update-doc docs/BENCHMARKS.md
llama.cpp comes from PyPI:  CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FLASHDLLM = REPO / "build" / "bin" / "flashdllm"
SHARED = REPO.parent / "shared"
BENCH_110M = REPO / "models" / "bench-110m-f16.gguf"
SPM_VOCAB = SHARED / "llama-cpp-vocab-fixtures" / "ggml-vocab-llama-spm.gguf"
DOC_BEGIN = "<!-- bench_vs_llamacpp:begin -->"
DOC_END = "<!-- bench_vs_llamacpp:end -->"


# ----------------------------------------------------------------------------- results

@dataclass
class EngineSamples:
    """Per-repetition throughputs and latencies of one engine on one model."""

    pp_tok_s: list[float] = field(default_factory=list)
    tg_tok_s: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)  # every decode step of every repetition


@dataclass
class ModelResult:
    name: str
    path: str
    n_params: int
    flashdllm: EngineSamples
    llamacpp: EngineSamples


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "mean": statistics.fmean(xs),
        "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "p95": percentile(xs, 95),
    }


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default), like flashdllm bench."""
    s = sorted(xs)
    rank = q / 100 * (len(s) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


# ----------------------------------------------------------------------------- flashdllm

def run_flashdllm(binary: Path, model: Path, args) -> dict:
    cmd = [str(binary), "bench", "-m", str(model), "-p", str(args.n_prompt), "-n", str(args.n_gen),
           "-r", str(args.reps), "-t", str(args.threads), "--seed", str(args.seed), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"flashdllm bench failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def add_flashdllm_round(samples: EngineSamples, report: dict) -> None:
    samples.pp_tok_s += report["pp_tok_s_samples"]
    samples.ttft_ms += report["ttft_ms_samples"]
    samples.tg_tok_s += report.get("tg_tok_s_samples", [])
    samples.itl_ms += report.get("itl_ms_samples", [])


# ----------------------------------------------------------------------------- llama.cpp

class LlamaCppRunner:
    """The pp/tg workload on llama.cpp's C API (through llama-cpp-python's ctypes bindings).

    The low-level API is used instead of `Llama.eval` so that per-token Python overhead is a
    few ctypes calls plus one NumPy argmax, close to what llama-bench itself does."""

    def __init__(self, model: Path, n_ctx: int, n_batch: int, threads: int):
        import numpy as np  # installed with llama-cpp-python
        import llama_cpp as L

        self.L, self.np = L, np
        self._quiet = L.llama_log_callback(lambda level, text, user: None)  # keep a reference
        L.llama_log_set(self._quiet, ctypes.c_void_p(0))
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(str(model).encode(), mparams)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {model}")
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise SystemExit(f"llama.cpp could not create a context for {model}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.memory = L.llama_get_memory(self.ctx)
        self.one = (L.llama_token * 1)()

    def close(self) -> None:
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)

    def _decode_and_pick(self, tokens, n: int) -> int:
        rc = self.L.llama_decode(self.ctx, self.L.llama_batch_get_one(tokens, n))
        if rc != 0:
            raise SystemExit(f"llama_decode failed with {rc}")
        logits = self.L.llama_get_logits_ith(self.ctx, -1)
        return int(self.np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax())

    def run(self, prompt: list[int], n_gen: int) -> tuple[float, list[float]]:
        """One repetition in a cleared KV cache: (prefill ms, per-decode-step ms)."""
        self.L.llama_memory_clear(self.memory, True)
        tokens = (self.L.llama_token * len(prompt))(*prompt)
        t0 = time.perf_counter()
        token = self._decode_and_pick(tokens, len(prompt))
        prefill_ms = (time.perf_counter() - t0) * 1e3
        steps = []
        for _ in range(n_gen):
            self.one[0] = token
            t0 = time.perf_counter()
            token = self._decode_and_pick(self.one, 1)
            steps.append((time.perf_counter() - t0) * 1e3)
        return prefill_ms, steps


def add_llamacpp_round(samples: EngineSamples, runner: LlamaCppRunner, prompt: list[int],
                       reps: int, n_gen: int) -> None:
    for _ in range(reps):
        prefill_ms, steps = runner.run(prompt, n_gen)
        samples.pp_tok_s.append(len(prompt) / (prefill_ms / 1e3))
        samples.ttft_ms.append(prefill_ms)
        if steps:
            samples.tg_tok_s.append(len(steps) / (sum(steps) / 1e3))
            samples.itl_ms += steps


# ----------------------------------------------------------------------------- driver

def ensure_bench_110m(binary: Path) -> None:
    if BENCH_110M.exists():
        return
    BENCH_110M.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(binary), "tools", "make-model", "--preset", "110m", "--dtype", "f16",
           "--vocab-from", str(SPM_VOCAB), "-o", str(BENCH_110M)]
    print("creating", BENCH_110M, file=sys.stderr)
    subprocess.run(cmd, check=True)


def bench_model(name: str, path: Path, binary: Path, args) -> ModelResult:
    print(f"[{name}] {path}", file=sys.stderr)
    n_ctx = args.n_prompt + args.n_gen + 16
    n_batch = max(512, args.n_prompt)
    runner = LlamaCppRunner(path, n_ctx, n_batch, args.threads)
    fdl, lcpp = EngineSamples(), EngineSamples()
    prompt = None
    n_params = 0
    try:
        for rnd in range(args.rounds):
            report = run_flashdllm(binary, path, args)
            add_flashdllm_round(fdl, report)
            n_params = report["n_params"]
            if prompt is None:
                prompt = report["prompt_token_ids"]
                if max(prompt) >= runner.n_vocab:
                    raise SystemExit(f"prompt id {max(prompt)} outside llama.cpp's vocab {runner.n_vocab}")
                runner.run(prompt, 1)  # llama.cpp warm-up, like flashdllm's
            add_llamacpp_round(lcpp, runner, prompt, args.reps, args.n_gen)
            print(f"  round {rnd + 1}/{args.rounds}: flashdllm pp {statistics.median(fdl.pp_tok_s):.1f} "
                  f"tg {median_or_nan(fdl.tg_tok_s):.1f} | llama.cpp pp {statistics.median(lcpp.pp_tok_s):.1f} "
                  f"tg {median_or_nan(lcpp.tg_tok_s):.1f} tok/s", file=sys.stderr)
    finally:
        runner.close()
    return ModelResult(name, str(path), n_params, fdl, lcpp)


def median_or_nan(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def machine_info(load_at_start: float) -> dict:
    import llama_cpp as L

    def run(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO).stdout.strip()
        except OSError:
            return ""

    cpu = ""
    for line in run(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
    commit = run(["git", "rev-parse", "--short", "HEAD"])
    if run(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += " (with uncommitted changes)"
    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu or platform.processor(),
        "logical_cpus": os.cpu_count(),
        "flashdllm_commit": commit,
        "llama_cpp_python": getattr(L, "__version__", "?"),
        "llama_cpp_system_info": L.llama_print_system_info().decode().strip(" |"),
        "loadavg_1min_start": load_at_start,
        "loadavg_1min_end": os.getloadavg()[0],
    }


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def rows(results: list[ModelResult], args) -> list[list[str]]:
    out = []
    for r in results:
        for test, key in ((f"pp{args.n_prompt}", "pp_tok_s"), (f"tg{args.n_gen}", "tg_tok_s")):
            f, l = summary(getattr(r.flashdllm, key)), summary(getattr(r.llamacpp, key))
            if f["n"] == 0 or l["n"] == 0:
                continue
            out.append([r.name, f"{r.n_params / 1e6:.2f} M", test,
                        f"{f['median']:.2f} ± {f['stdev']:.2f}", f"{l['median']:.2f} ± {l['stdev']:.2f}",
                        f"{ratio(f['median'], l['median']):.2f}"])
    return out


def latency_rows(results: list[ModelResult]) -> list[list[str]]:
    out = []
    for r in results:
        for engine, s in (("flashdllm", r.flashdllm), ("llama.cpp", r.llamacpp)):
            ttft, itl = summary(s.ttft_ms), summary(s.itl_ms)
            out.append([r.name, engine, f"{ttft['median']:.2f}",
                        f"{itl['median']:.3f}" if itl["n"] else "-",
                        f"{itl['p95']:.3f}" if itl["n"] else "-"])
    return out


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


THROUGHPUT_HEADER = ["model", "params", "test", "flashdllm t/s (median ± sd)",
                     "llama.cpp t/s (median ± sd)", "flashdllm / llama.cpp"]
LATENCY_HEADER = ["model", "engine", "TTFT ms (median)", "inter-token ms p50", "inter-token ms p95"]


def markdown_section(results: list[ModelResult], info: dict, args) -> str:
    n = args.rounds * args.reps
    return "\n".join([
        f"Measured {info['date']} on {info['cpu']} ({info['logical_cpus']} logical CPUs, "
        f"1-min load average {info['loadavg_1min_start']:.1f} at the start, "
        f"{info['loadavg_1min_end']:.1f} at the end), {args.threads} threads for both engines.",
        f"flashdllm commit {info['flashdllm_commit']}; llama.cpp from llama-cpp-python "
        f"{info['llama_cpp_python']} built with GGML_NATIVE ({info['llama_cpp_system_info']}).",
        f"{n} repetitions per engine and test ({args.rounds} interleaved rounds of {args.reps}), "
        f"after one warm-up each; prompt seed {args.seed}.",
        "",
        markdown_table(THROUGHPUT_HEADER, rows(results, args)),
        "",
        markdown_table(LATENCY_HEADER, latency_rows(results)),
        "",
        "Command: `python3 bench/bench_vs_llamacpp.py " + " ".join(sys.argv[1:]) + "`",
    ])


def update_doc(doc: Path, section: str) -> None:
    text = doc.read_text()
    if DOC_BEGIN not in text or DOC_END not in text:
        raise SystemExit(f"{doc} has no {DOC_BEGIN} ... {DOC_END} markers to replace")
    head, rest = text.split(DOC_BEGIN, 1)
    _, tail = rest.split(DOC_END, 1)
    doc.write_text(head + DOC_BEGIN + "\n" + section + "\n" + DOC_END + tail)


def parse_args(argv: list[str]):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashdllm", type=Path, default=DEFAULT_FLASHDLLM, help="flashdllm binary")
    ap.add_argument("--model", action="append", metavar="NAME=PATH",
                    help="model to benchmark (repeatable); default: stories260K and bench-110m-f16")
    ap.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens (pp test)")
    ap.add_argument("-n", "--n-gen", type=int, default=128, help="decode steps (tg test)")
    ap.add_argument("-r", "--reps", type=int, default=3, help="repetitions per round and engine")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per model")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads for both engines")
    ap.add_argument("--seed", type=int, default=42, help="seed of the random prompt ids")
    ap.add_argument("--json", type=Path, help="also write all samples to this JSON file")
    ap.add_argument("--markdown", type=Path, help="write the results as a markdown section here")
    ap.add_argument("--update-doc", type=Path,
                    help=f"replace the text between {DOC_BEGIN} and {DOC_END} in this file")
    args = ap.parse_args(argv)
    for flag, v, lo in (("-p", args.n_prompt, 1), ("-n", args.n_gen, 1), ("-r", args.reps, 1),
                        ("--rounds", args.rounds, 1), ("-t", args.threads, 1)):
        if v < lo:
            ap.error(f"{flag} must be >= {lo}, got {v}")
    return args


def selected_models(args) -> list[tuple[str, Path]]:
    if not args.model:
        ensure_bench_110m(args.flashdllm)
        return [("stories260K", SHARED / "models" / "stories260K.gguf"), ("110m-f16", BENCH_110M)]
    models = []
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec).stem, spec
        models.append((name, Path(path)))
    return models


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not args.flashdllm.exists():
        raise SystemExit(f"{args.flashdllm} not found: build it with "
                         "`cmake --build build --target flashdllm`")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit('llama_cpp not importable: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python')
    load = os.getloadavg()[0]
    if load > 0.5:
        # llama.cpp's OpenMP threads spin at barriers: when another process takes one of the
        # cores, a decode step can stall for a whole scheduler slice. Its numbers suffer far
        # more than flashdllm's on a busy machine, so say so next to the results.
        print(f"warning: 1-min load average is {load:.1f}; results are only comparable on an "
              "otherwise idle machine", file=sys.stderr)
    models = selected_models(args)
    for _, path in models:
        if not path.exists():
            raise SystemExit(f"model {path} not found")

    results = [bench_model(name, path, args.flashdllm, args) for name, path in models]
    info = machine_info(load)

    print()
    for k, v in info.items():
        print(f"{k}: {v}")
    print()
    print(markdown_table(THROUGHPUT_HEADER, rows(results, args)))
    print()
    print(markdown_table(LATENCY_HEADER, latency_rows(results)))

    section = markdown_section(results, info, args)
    if args.markdown:
        args.markdown.write_text(section + "\n")
    if args.update_doc:
        update_doc(args.update_doc, section)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": info, "args": {k: str(v) for k, v in vars(args).items()},
            "results": [{"name": r.name, "path": r.path, "n_params": r.n_params,
                         "flashdllm": vars(r.flashdllm), "llama.cpp": vars(r.llamacpp)}
                        for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
