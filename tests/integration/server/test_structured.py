"""Structured outputs through `flashdllm serve`: JSON schemas, GBNF grammars and the
official client's `chat.completions.parse`, sampled at temperature 1.

Every output must parse and validate: JSON with the `jsonschema` package against the 20
schemas of tests/data/structured/json_schemas.json, GBNF outputs with parsers written here
independently of the engine. Models: stories260K, codelm-16m and a random-weight 110m-shape
model made by `flashdllm tools make-model` with codelm's vocabulary.

FLASHDLLM_STRUCTURED_REQUESTS sets the number of schema requests per model (default: 200 on
the two real models, 40 on the random one); the long form sets it to 1000
(docs/GRAMMARS.md has its figures).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).parent))
from server_harness import CODELM, STORIES, Server, flashdllm_bin, model_path  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data" / "structured"
SCHEMAS = json.loads((DATA / "json_schemas.json").read_text())
PROMPTS = ["Once upon a time", "Write the data as JSON:", "# config\n", "The answer is"]


def schema_requests(n: int) -> list[tuple[dict, dict]]:
    out = []
    for i in range(n):
        entry = SCHEMAS[i % len(SCHEMAS)]
        body = {
            "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            "temperature": 1.0,
            "seed": 1000 + i,
            "max_tokens": 1500,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": entry["name"], "schema": entry["schema"], "strict": True}},
        }
        out.append((entry, body))
    return out


def run_concurrently(server: Server, bodies: list[dict], path="/v1/chat/completions", workers=8) -> list[dict]:
    def one(body):
        status, payload = server.post(path, body)
        return status, payload
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, bodies))


def message_text(payload: dict) -> str:
    choice = payload["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


# --- independent checkers for the GBNF test grammars --------------------------------------

_NUM = r"(?:[1-9][0-9]{0,3}|0)"
_E3 = rf"{_NUM}(?: [+-] {_NUM}){{0,2}}"
_F2 = rf"(?:{_NUM}|\({_E3}\))"
_T2 = rf"{_F2}(?: [*/] {_F2}){{0,2}}"
_E2 = rf"{_T2}(?: [+-] {_T2}){{0,2}}"
_F = rf"(?:{_NUM}|\({_E2}\))"
_T = rf"{_F}(?: [*/] {_F}){{0,2}}"
ARITHMETIC = re.compile(rf"{_T}(?: [+-] {_T}){{0,3}}")


def check_json_grammar(text: str):
    value = json.loads(text)
    assert isinstance(value, dict), text


class MiniLang:
    """Recursive descent over tests/data/structured/minilang.gbnf's language."""

    def __init__(self, text: str):
        self.s, self.i = text, 0

    def eat(self, lit: str):
        if not self.s.startswith(lit, self.i):
            raise ValueError(f"expected {lit!r} at {self.i}: {self.s!r}")
        self.i += len(lit)

    def regex(self, pattern: str):
        m = re.compile(pattern).match(self.s, self.i)
        if not m:
            raise ValueError(f"expected /{pattern}/ at {self.i}: {self.s!r}")
        self.i = m.end()

    def factor(self):
        if self.s.startswith("(", self.i):
            self.eat("(")
            self.term()
            self.eat(")")
        else:
            self.regex(r"[a-z][a-z0-9_]{0,6}|[0-9]{1,4}")

    def term(self):
        self.factor()
        if self.s.startswith((" * ", " / "), self.i):
            self.i += 3
            self.factor()

    def expr(self):
        self.term()
        for _ in range(2):
            if self.s.startswith((" + ", " - "), self.i):
                self.i += 3
                self.term()

    def simple(self):
        if self.s.startswith("let ", self.i):
            self.eat("let ")
            self.regex(r"[a-z][a-z0-9_]{0,6}")
            self.eat(" = ")
            self.expr()
        else:
            self.eat("print(")
            self.expr()
            self.eat(")")
        self.eat(";\n")

    def program(self):
        n = 0
        while self.i < len(self.s):
            if self.s.startswith("if ", self.i):
                self.eat("if ")
                self.expr()
                self.eat(" {\n")
                k = 0
                while self.s.startswith("  ", self.i):
                    self.eat("  ")
                    self.simple()
                    k += 1
                if not 1 <= k <= 2:
                    raise ValueError(f"if block with {k} statements: {self.s!r}")
                self.eat("}\n")
            else:
                self.simple()
            n += 1
        if not 1 <= n <= 4:
            raise ValueError(f"{n} statements: {self.s!r}")


GRAMMARS = {
    "arithmetic.gbnf": lambda t: (ARITHMETIC.fullmatch(t) or (_ for _ in ()).throw(ValueError(t))),
    "json.gbnf": check_json_grammar,
    "minilang.gbnf": lambda t: MiniLang(t).program(),
}


_RANDOM_MODEL: str | None = None


def random_110m() -> str:
    """A random-weight 110m-shape model with codelm's tokenizer, made once per run."""
    global _RANDOM_MODEL
    if _RANDOM_MODEL is None:
        path = os.path.join(tempfile.mkdtemp(prefix="flashdllm-structured-"), "random-110m-q8_0.gguf")
        subprocess.run([flashdllm_bin(), "tools", "make-model", "-o", path, "--preset", "110m", "--dtype", "q8_0",
                        "--vocab-from", model_path(CODELM), "-t", "2"], check=True, capture_output=True)
        _RANDOM_MODEL = path
    return _RANDOM_MODEL


def requests_for(model_kind: str) -> int:
    env = os.environ.get("FLASHDLLM_STRUCTURED_REQUESTS")
    if env:
        return int(env)
    return 40 if model_kind == "random" else 200


class StructuredOutputs(unittest.TestCase):
    def check_schemas(self, server: Server, n: int):
        results = run_concurrently(server, [b for _, b in schema_requests(n)])
        failures = []
        for (entry, _), (status, payload) in zip(schema_requests(n), results):
            if status != 200:
                failures.append(f"{entry['name']}: HTTP {status} {payload}")
                continue
            text = message_text(payload)
            try:
                jsonschema.validate(json.loads(text), entry["schema"])
            except Exception as e:  # noqa: BLE001 - report every failure with its text
                failures.append(f"{entry['name']}: {type(e).__name__}: {e} in {text!r}")
            if payload["choices"][0]["finish_reason"] != "stop":
                failures.append(f"{entry['name']}: finish_reason {payload['choices'][0]['finish_reason']}: {text!r}")
        self.assertEqual(failures, [], f"{len(failures)} of {n} outputs invalid")

    def check_grammars(self, server: Server, per_grammar: int):
        for name, check in GRAMMARS.items():
            grammar = (DATA / name).read_text()
            bodies = [{"prompt": PROMPTS[i % len(PROMPTS)], "temperature": 1.0, "seed": 7 + i, "max_tokens": 1500,
                       "grammar": grammar} for i in range(per_grammar)]
            for status, payload in run_concurrently(server, bodies, path="/v1/completions"):
                self.assertEqual(status, 200, payload)
                text = payload["choices"][0]["text"]
                self.assertEqual(payload["choices"][0]["finish_reason"], "stop", text)
                check(text)

    def test_stories260k(self):
        with Server("--chat-template", "chatml", model=STORIES) as server:
            self.check_schemas(server, requests_for("stories"))
            self.check_grammars(server, 10)

    def test_codelm(self):
        with Server("--chat-template", "chatml", model=CODELM) as server:
            self.check_schemas(server, requests_for("codelm"))
            self.check_grammars(server, 6)

    def test_random_110m(self):
        with Server("--chat-template", "chatml", model=random_110m()) as server:
            self.check_schemas(server, requests_for("random"))
            self.check_grammars(server, 2)

    def test_openai_parse_with_pydantic(self):
        from typing import Literal

        import pydantic

        class Address(pydantic.BaseModel):
            city: str = pydantic.Field(max_length=12)
            zip: str = pydantic.Field(pattern=r"^[0-9]{5}$")

        class Person(pydantic.BaseModel):
            name: str = pydantic.Field(max_length=16)
            age: int = pydantic.Field(ge=0, le=120)
            role: Literal["admin", "user"]
            address: Address

        with Server("--chat-template", "chatml", model=CODELM) as server:
            client = server.openai()
            for seed in range(3):
                completion = client.chat.completions.parse(
                    model="m", messages=[{"role": "user", "content": "A person:"}], response_format=Person,
                    temperature=1.0, seed=seed, max_tokens=400)
                person = completion.choices[0].message.parsed
                self.assertIsInstance(person, Person)
                self.assertIn(person.role, ("admin", "user"))

    def test_bad_schema_and_grammar_name_the_position(self):
        with Server("--chat-template", "chatml", model=STORIES) as server:
            status, payload = server.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "bad", "schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5,
                                                                                       "maximum": 1}},
                    "required": ["n"]}}}})
            self.assertEqual(status, 400, payload)
            self.assertEqual(payload["error"]["param"], "response_format.json_schema.schema")
            self.assertIn("/properties/n", payload["error"]["message"])
            status, payload = server.post("/v1/completions", {"prompt": "x", "grammar": "root ::= \"a\"\nfoo ::= bar"})
            self.assertEqual(status, 400, payload)
            self.assertEqual(payload["error"]["param"], "grammar")
            self.assertIn("line 2, column 9", payload["error"]["message"])
            status, payload = server.post("/v1/completions", {"prompt": "x", "grammar": 5})
            self.assertEqual(status, 400, payload)
            status, payload = server.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "x"}], "grammar": "root ::= \"a\"",
                "response_format": {"type": "json_object"}})
            self.assertEqual(status, 400, payload)
            status, payload = server.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})
            self.assertEqual(status, 400, payload)
            # The server still serves after the refusals.
            status, payload = server.post("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"},
                "max_tokens": 4, "temperature": 0})
            self.assertEqual(status, 200, payload)
            self.assertTrue(message_text(payload).startswith("{"), payload)

    def test_a_grammar_that_cannot_be_followed_is_the_clients_error(self):
        # Rules nested deeper than the matcher follows: the grammar compiles, but no token of
        # the vocabulary continues it. A 400 naming the cause, whole or streamed; the
        # server goes on serving.
        rules = ["root ::= r0"] + [f'r{i} ::= r{i + 1} "]"' for i in range(5000)] + ['r5000 ::= "x"']
        body = {"prompt": "x", "grammar": "\n".join(rules), "max_tokens": 8}
        with Server(model=STORIES) as server:
            status, payload = server.post("/v1/completions", body)
            self.assertEqual(status, 400, payload)
            self.assertEqual(payload["error"]["code"], "grammar_not_followable")
            self.assertIn("allows no token", payload["error"]["message"])
            events = server.stream_events("/v1/completions", {**body, "stream": True})
            errors = [e["error"] for e in events if isinstance(e, dict) and "error" in e]
            self.assertEqual([e["code"] for e in errors], ["grammar_not_followable"], events)
            status, payload = server.post("/v1/completions", {"prompt": "x", "grammar": 'root ::= "ab"'})
            self.assertEqual(status, 200, payload)
            self.assertEqual(payload["choices"][0]["text"], "ab")

    def test_streamed_equals_whole(self):
        # Streamed deltas concatenate to the whole response's text, for a schema and for any
        # JSON object (unbounded: a "length" finish leaves a prefix of one, "stop" a whole one).
        schema = next(e["schema"] for e in SCHEMAS if e["name"] == "invoice")
        formats = [{"type": "json_schema", "json_schema": {"name": "invoice", "schema": schema}},
                   {"type": "json_object"}]
        with Server("--chat-template", "chatml", model=CODELM) as server:
            for rf in formats:
                for seed in range(3):
                    body = {"messages": [{"role": "user", "content": "x"}], "response_format": rf,
                            "max_tokens": 300, "temperature": 1.0, "seed": seed}
                    status, whole = server.post("/v1/chat/completions", body)
                    self.assertEqual(status, 200, whole)
                    events = server.stream_events("/v1/chat/completions", {**body, "stream": True})
                    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                                   if isinstance(e, dict) and e.get("choices"))
                    self.assertEqual(text, message_text(whole))
                    if whole["choices"][0]["finish_reason"] == "stop":
                        self.assertIsInstance(json.loads(text), dict)
                    if rf["type"] == "json_schema":
                        jsonschema.validate(json.loads(text), schema)


if __name__ == "__main__":
    unittest.main(verbosity=2)
