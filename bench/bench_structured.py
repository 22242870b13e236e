"""Grammar-constrained decoding, side by side with llama.cpp: what a JSON schema costs per
token, and how many tokens per forward the grammar's forced tokens give.

For each model and schema, greedy, batch 1, on the CPU:
  * flashdllm (`flashdllm generate --json -j SCHEMA`): ms per token constrained, with the
    forced drafts (default) and without them (`--spec-window 0`); the host time its masks,
    sampling and draft cutting took (`grammar.ms`) as a share of the decode time; tokens per
    forward;
  * llama.cpp (its C API through llama-cpp-python, a sampler chain of its grammar sampler and
    greedy): ms per token with the same GBNF (flashdllm's conversion of the schema, printed
    by `flashdllm tools json-schema-to-grammar`) and without a grammar;
  * both engines' unconstrained ms per token over the same number of tokens, so each
    engine's grammar overhead is its own constrained / unconstrained - 1;
  * flashdllm serving: `--serve-requests` requests in a row with the schema through
    `flashdllm serve` (temperature 1, one seed each), tokens per forward from its /metrics
    (plain constrained decoding makes exactly 1): sequences that share a schema share what
    was learned about how the model spells its fixed text.

Usage (repository root, after building build/bin/flashdllm):
  .venv/bin/python bench/bench_structured.py [--model FILE ...] [--rounds 3] [-t 2]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PROMPT = "Write the record as JSON:\n"

# Long fixed keys and enums: most of the output is forced by the schema.
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 999},
        "customer_full_legal_name": {"type": "string", "maxLength": 12},
        "preferred_contact_channel": {"enum": ["electronic_mail", "telephone_call", "postal_letter"]},
        "account_status_description": {"enum": ["active_and_in_good_standing", "suspended_pending_review"]},
        "has_accepted_terms_and_conditions": {"type": "boolean"},
    },
    "required": ["customer_identification_number", "customer_full_legal_name", "preferred_contact_channel",
                 "account_status_description", "has_accepted_terms_and_conditions"],
    "additionalProperties": False,
}


def schemas() -> dict[str, dict]:
    out = {"long_keys": LONG_KEYS}
    for entry in json.loads((REPO / "tests/data/structured/json_schemas.json").read_text()):
        if entry["name"] in ("person", "invoice", "nested"):
            out[entry["name"]] = entry["schema"]
    return out


def flashdllm(binary: Path, model: Path, threads: int, n: int, extra: list[str]) -> dict:
    cmd = [str(binary), "generate", "-m", str(model), "-p", PROMPT, "--temp", "0", "-n", str(n), "-t", str(threads),
           "--json", *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def per_token_ms(report: dict) -> float:
    t = report["timings"]
    return t["decode_ms"] / max(t["gen_tokens"] - 1, 1)


class LlamaCpp:
    def __init__(self, model: Path, threads: int):
        import llama_cpp as L
        self.L = L
        self._quiet = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(self._quiet, ctypes.c_void_p(0))
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(str(model).encode(), L.llama_model_default_params())
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 2048, 512, threads, threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.mem = L.llama_get_memory(self.ctx)

    def tokenize(self, text: str) -> list[int]:
        buf = (self.L.llama_token * 4096)()
        n = self.L.llama_tokenize(self.vocab, text.encode(), len(text.encode()), buf, 4096, True, False)
        return list(buf[:n])

    def run(self, gbnf: str | None, n: int) -> tuple[int, float]:
        """Greedy decode of up to n tokens (stopping at end-of-generation); (tokens, ms per token)."""
        L = self.L
        L.llama_memory_clear(self.mem, True)
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if gbnf is not None:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root"))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        prompt = self.tokenize(PROMPT)
        arr = (L.llama_token * len(prompt))(*prompt)
        L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(prompt)))
        one = (L.llama_token * 1)()
        tok = L.llama_sampler_sample(chain, self.ctx, -1)
        produced, t0 = 1, time.perf_counter()
        while produced < n and not L.llama_vocab_is_eog(self.vocab, tok):
            one[0] = tok
            L.llama_decode(self.ctx, L.llama_batch_get_one(one, 1))
            tok = L.llama_sampler_sample(chain, self.ctx, -1)
            produced += 1
        ms = (time.perf_counter() - t0) * 1e3
        L.llama_sampler_free(chain)
        return produced, ms / max(produced - 1, 1)


def serve_tokens_per_forward(binary: Path, model: Path, schema: dict, n: int, threads: int) -> tuple[float, float]:
    """(tokens per forward, forced drafts accepted) over n chat requests in a row."""
    import re
    import urllib.request
    proc = subprocess.Popen([str(binary), "serve", "-m", str(model), "--port", "0", "-t", str(threads),
                             "--chat-template", "chatml"], stderr=subprocess.PIPE, text=True)
    try:
        port = None
        while port is None:
            line = proc.stderr.readline()
            if not line:
                raise SystemExit("flashdllm serve exited")
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        base = f"http://127.0.0.1:{port}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for i in range(n):
            body = {"messages": [{"role": "user", "content": PROMPT}], "temperature": 1.0, "seed": i, "max_tokens": 400,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
            req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            opener.open(req).read()
        metrics = opener.open(base + "/metrics").read().decode()
        val = lambda name: float(re.search(rf"^{name} (\S+)$", metrics, re.M).group(1))
        tpf = val("flashdllm_generation_tokens_total") / val("flashdllm_engine_steps_total")
        acc = val("flashdllm_grammar_forced_accepted_tokens_total") / max(val("flashdllm_grammar_forced_drafted_tokens_total"), 1)
        return tpf, acc
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashdllm", type=Path, default=REPO / "build" / "bin" / "flashdllm")
    ap.add_argument("--model", type=Path, action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=300, help="token limit per output")
    ap.add_argument("--serve-requests", type=int, default=20)
    args = ap.parse_args()
    models = args.model or [SHARED / "models" / "codelm-16m-f16.gguf", REPO / "models" / "bench-110m-Q8_0.gguf"]
    rows = []
    for model in models:
        lcpp = LlamaCpp(model, args.threads)
        for name, schema in schemas().items():
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(schema, f)
            gbnf = subprocess.run([str(args.flashdllm), "tools", "json-schema-to-grammar", f.name], check=True,
                                  capture_output=True, text=True).stdout
            r = {"fdl_forced": [], "fdl_plain": [], "fdl_free": [], "fdl_share": [], "lc_gram": [], "lc_free": []}
            tpf = forced_acc = 0.0
            gen = lc_gen = 0
            for _ in range(args.rounds):
                forced = flashdllm(args.flashdllm, model, args.threads, args.n, ["--json-schema-file", f.name])
                plain = flashdllm(args.flashdllm, model, args.threads, args.n,
                                  ["--json-schema-file", f.name, "--spec-window", "0"])
                gen = forced["timings"]["gen_tokens"]
                free = flashdllm(args.flashdllm, model, args.threads, gen, ["--ignore-eos"])
                r["fdl_forced"].append(per_token_ms(forced))
                r["fdl_plain"].append(per_token_ms(plain))
                r["fdl_free"].append(per_token_ms(free))
                r["fdl_share"].append(plain["grammar"]["ms"] / plain["timings"]["decode_ms"])
                tpf = forced["spec"]["tokens_per_forward"]
                forced_acc = forced["spec"]["forced_accepted"] / max(forced["spec"]["forced_drafted"], 1)
                lc_gen, ms = lcpp.run(gbnf, args.n)
                r["lc_gram"].append(ms)
                r["lc_free"].append(lcpp.run(None, lc_gen)[1])
            med = {k: statistics.median(v) for k, v in r.items()}
            serve = serve_tokens_per_forward(args.flashdllm, model, schema, args.serve_requests, args.threads)
            rows.append((model.name, name, gen, lc_gen, med, tpf, forced_acc, serve))
            print(f"{model.name} {name}: done", file=sys.stderr)
    print("| model | schema | tokens (fdl / llama.cpp) | flashdllm ms/tok: free, constrained, +forced drafts | "
          "flashdllm grammar host share | flashdllm tokens/forward (forced accepted) | llama.cpp ms/tok: free, "
          "constrained | overhead flashdllm / llama.cpp | served: tokens/forward (forced accepted) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, name, gen, lc_gen, m, tpf, acc, (stpf, sacc) in rows:
        fo = m["fdl_plain"] / m["fdl_free"] - 1
        lo = m["lc_gram"] / m["lc_free"] - 1
        print(f"| {model} | {name} | {gen} / {lc_gen} | {m['fdl_free']:.2f}, {m['fdl_plain']:.2f}, {m['fdl_forced']:.2f} | "
              f"{100 * m['fdl_share']:.1f}% | {tpf:.2f} ({100 * acc:.0f}%) | {m['lc_free']:.2f}, {m['lc_gram']:.2f} | "
              f"{100 * fo:+.1f}% / {100 * lo:+.1f}% | {stpf:.2f} ({100 * sacc:.0f}%) |")


if __name__ == "__main__":
    main()
