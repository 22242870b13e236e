"""`flashdllm serve` through the official openai client: completions, chat, streaming with
usage, stop strings, n, logprobs, seeds, streamed == non-streamed, models, health, metrics,
and graceful SIGTERM."""
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import openai

from server_harness import CODELM, STORIES, Server, completion_text, flashdllm_bin, model_path, read_events

PROMPT = "Once upon a time"


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--chat-template", "chatml")
        cls.client = cls.server.openai()

    @classmethod
    def tearDownClass(cls):
        rc = cls.server.stop()
        if rc != 0:
            raise AssertionError(f"server exited with {rc}:\n" + "".join(cls.server.stderr_lines))

    def complete(self, **kw):
        args = dict(model="stories", prompt=PROMPT, max_tokens=24, temperature=0)
        args.update(kw)
        return self.client.completions.create(**args)

    def test_completion_shape_and_usage(self):
        r = self.complete()
        self.assertEqual(r.object, "text_completion")
        self.assertTrue(r.id.startswith("cmpl-"))
        self.assertEqual(r.model, "stories260K")
        self.assertEqual(len(r.choices), 1)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertTrue(r.choices[0].text)
        self.assertEqual(r.usage.completion_tokens, 24)
        self.assertEqual(r.usage.prompt_tokens, 5)  # BOS + 4 pieces for stories260K
        self.assertEqual(r.usage.total_tokens, 29)
        self.assertIsNotNone(r.usage.prompt_tokens_details)

    def test_greedy_is_deterministic_and_matches_token_prompt(self):
        a = self.complete().choices[0].text
        self.assertEqual(self.complete().choices[0].text, a)
        # The prompt as token ids (from `flashdllm tokenize`, BOS included) gives the same text.
        out = subprocess.run([flashdllm_bin(), "tokenize", "-m", model_path(STORIES), "--text", PROMPT, "--json"],
                             check=True, capture_output=True, text=True).stdout
        ids = json.loads(out)["ids"]
        self.assertEqual(self.complete(prompt=ids).choices[0].text, a)
        self.assertEqual(self.complete(prompt=[ids]).choices[0].text, a)
        lp = self.complete(logprobs=1).choices[0].logprobs
        self.assertEqual("".join(lp.tokens), a)

    def test_streamed_equals_non_streamed_with_usage(self):
        for temperature, seed in ((0, None), (0.9, 7), (1.5, 123)):
            whole = self.complete(temperature=temperature, seed=seed, max_tokens=40)
            chunks = list(self.complete(temperature=temperature, seed=seed, max_tokens=40, stream=True,
                                        stream_options={"include_usage": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            self.assertEqual(text, whole.choices[0].text)
            finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            self.assertEqual(finals, [whole.choices[0].finish_reason])
            self.assertEqual(len(chunks[-1].choices), 0)  # the usage chunk comes last
            self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
            self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)
            self.assertTrue(all(c.usage is None for c in chunks[:-1]))

    def test_raw_stream_framing(self):
        events = self.server.stream_events("/v1/completions", {
            "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True})
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2]["choices"][0]["finish_reason"], "length")
        self.assertTrue(all(e["object"] == "text_completion" for e in events[:-1]))
        self.assertEqual(len({e["id"] for e in events[:-1]}), 1)

    def test_stop_strings(self):
        full = self.complete(max_tokens=60).choices[0].text
        cut = full.index(" was") if " was" in full else None
        self.assertIsNotNone(cut, full)
        r = self.complete(max_tokens=60, stop=[" was", "zzz"])
        self.assertEqual(r.choices[0].text, full[:cut])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        chunks = list(self.complete(max_tokens=60, stop=" was", stream=True))
        self.assertEqual("".join(c.choices[0].text for c in chunks), full[:cut])

    def test_n_choices(self):
        r = self.complete(n=2)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.choices[0].text, r.choices[1].text)  # greedy: identical
        self.assertEqual(r.usage.completion_tokens, 48)
        s = self.complete(n=2, temperature=1.0, seed=5, max_tokens=30)
        again = self.complete(n=2, temperature=1.0, seed=5, max_tokens=30)
        self.assertEqual([c.text for c in s.choices], [c.text for c in again.choices])
        self.assertNotEqual(s.choices[0].text, s.choices[1].text)  # seeds 5 and 6
        # Choice 1 of seed 5 is choice 0 of seed 6.
        self.assertEqual(self.complete(temperature=1.0, seed=6, max_tokens=30).choices[0].text,
                         s.choices[1].text)
        streamed = list(self.complete(n=2, temperature=1.0, seed=5, max_tokens=30, stream=True))
        texts = completion_text([c.model_dump() for c in streamed])
        self.assertEqual(texts, {0: s.choices[0].text, 1: s.choices[1].text})

    def test_seed_reproducibility(self):
        a = self.complete(temperature=1.0, seed=42, max_tokens=40).choices[0].text
        b = self.complete(temperature=1.0, seed=42, max_tokens=40).choices[0].text
        c = self.complete(temperature=1.0, seed=43, max_tokens=40).choices[0].text
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)

    def test_logprobs_completions(self):
        r = self.complete(logprobs=3, max_tokens=10)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 10)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(lp.text_offset[0], 0)
        for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(value, 0.0)
            self.assertLessEqual(len(top), 3)
            self.assertIn(tok, top)  # greedy: the chosen token is the most likely
            self.assertAlmostEqual(max(top.values()), value, places=5)
        # Streamed logprobs carry the same tokens.
        chunks = list(self.complete(logprobs=3, max_tokens=10, stream=True))
        streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        self.assertEqual(streamed, lp.tokens)

    def test_chat(self):
        msgs = [{"role": "system", "content": "Tell a story."},
                {"role": "user", "content": [{"type": "text", "text": "Once upon"}, {"type": "text", "text": " a time"}]}]
        r = self.client.chat.completions.create(model="x", messages=msgs, max_tokens=20, temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        # The model writes ChatML markers as plain text (its vocabulary lacks them): the
        # end marker is a stop string, never part of the answer.
        self.assertNotIn("<|im_end|>", r.choices[0].message.content)
        chunks = list(self.client.chat.completions.create(model="x", messages=msgs, max_tokens=20, temperature=0,
                                                          stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, r.choices[0].message.content)
        self.assertEqual(chunks[-1].usage.completion_tokens, r.usage.completion_tokens)
        lp = self.client.chat.completions.create(model="x", messages=msgs, max_tokens=5, temperature=0,
                                                 logprobs=True, top_logprobs=2)
        content = lp.choices[0].logprobs.content
        self.assertEqual(len(content), lp.usage.completion_tokens)
        self.assertTrue(all(len(c.top_logprobs) == 2 for c in content))
        self.assertEqual(bytes(b for c in content for b in c.bytes).decode("utf-8", "replace"),
                         lp.choices[0].message.content)

    def test_chat_max_completion_tokens(self):
        r = self.client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                                max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 3)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_models_health_metrics(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["stories260K"])
        self.assertEqual(self.client.models.retrieve("stories260K").id, "stories260K")
        with self.assertRaises(openai.NotFoundError):
            self.client.models.retrieve("nope")
        self.assertEqual(self.server.request("GET", "/health")[0], 200)
        self.complete()
        m = self.server.metrics()
        for name in ("flashdllm_time_to_first_token_ms_count", "flashdllm_inter_token_latency_ms_count",
                     "flashdllm_queue_time_ms_count", "flashdllm_e2e_request_latency_ms_count",
                     "flashdllm_requests_running", "flashdllm_requests_waiting", "flashdllm_kv_blocks_total",
                     "flashdllm_kv_blocks_free", "flashdllm_kv_blocks_cached", "flashdllm_kv_bytes_used",
                     "flashdllm_prefix_cache_queries_total", "flashdllm_prefix_cache_hits_total",
                     "flashdllm_prefix_cache_hit_rate", "flashdllm_spec_drafted_tokens_total",
                     "flashdllm_spec_accepted_tokens_total", "flashdllm_spec_acceptance_rate",
                     "flashdllm_spec_tree_steps_total", "flashdllm_spec_tree_alt_accepted_tokens_total",
                     'flashdllm_breaker_open{name="speculation"}', 'flashdllm_breaker_open{name="disk_offload"}',
                     'flashdllm_requests_finished_total{finish_reason="length"}',
                     "flashdllm_prompt_tokens_total", "flashdllm_generation_tokens_total"):
            self.assertIn(name, m)
        self.assertGreater(m["flashdllm_generation_tokens_total"], 0)
        self.assertGreater(m["flashdllm_time_to_first_token_ms_count"], 0)
        # The same prompt again is served partly from the prefix cache.
        before = self.server.metrics()["flashdllm_prefix_cache_hits_total"]
        long_prompt = "The little dog ran to the park and played with a big red ball all day long. " * 3
        self.complete(prompt=long_prompt, max_tokens=2)
        r = self.complete(prompt=long_prompt, max_tokens=2)
        self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertGreater(self.server.metrics()["flashdllm_prefix_cache_hits_total"], before)


class CodeModel(unittest.TestCase):
    def test_code_completion_and_chat(self):
        with Server("--chat-template", "chatml", "--ctx-size", "512", model=CODELM) as s:
            c = s.openai()
            r = c.completions.create(model="codelm", prompt="def fibonacci(n):\n", max_tokens=48,
                                     temperature=0, stop=["\n\n"])
            self.assertNotIn("\n\n", r.choices[0].text)
            self.assertTrue(r.choices[0].text.strip())
            chat = c.chat.completions.create(model="codelm", messages=[
                {"role": "user", "content": "def add(a, b):"}], max_tokens=16, temperature=0)
            self.assertEqual(chat.choices[0].message.role, "assistant")
            self.assertGreater(chat.usage.completion_tokens, 0)
            self.assertIn(chat.choices[0].finish_reason, ("stop", "length"))
            # codelm's vocabulary lacks ChatML markers: it may write "<|im_end|>" as text,
            # which the server's stop string cuts (then the answer can even be empty).
            self.assertNotIn("<|im_end|>", chat.choices[0].message.content)
            streamed = list(c.chat.completions.create(model="codelm", messages=[
                {"role": "user", "content": "def add(a, b):"}], max_tokens=16, temperature=0, stream=True))
            self.assertEqual("".join(ch.choices[0].delta.content or "" for ch in streamed),
                             chat.choices[0].message.content)
            self.assertEqual(s.stop(), 0)


class Speculation(unittest.TestCase):
    def test_spec_auto_greedy_output_is_unchanged(self):
        body = {"prompt": PROMPT + ", there was a little girl named Lily.", "max_tokens": 96,
                "temperature": 0, "ignore_eos": True}
        with Server() as plain:
            _, ref = plain.post("/v1/completions", body)
        with Server("--spec", "auto", "--spec-window", "4") as spec:
            for _ in range(2):
                status, got = spec.post("/v1/completions", body)
                self.assertEqual(status, 200, got)
                self.assertEqual(got["choices"][0]["text"], ref["choices"][0]["text"])
            events = spec.stream_events("/v1/completions", dict(body, stream=True))
            self.assertEqual(completion_text(events)[0], ref["choices"][0]["text"])
            self.assertGreater(spec.metrics()["flashdllm_spec_drafted_tokens_total"], 0)


class NoChatTemplate(unittest.TestCase):
    def test_chat_refused_completions_work(self):
        with Server() as s:  # stories260K has no tokenizer.chat_template
            c = s.openai()
            with self.assertRaises(openai.BadRequestError) as e:
                c.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
            self.assertIn("chat template", str(e.exception))
            self.assertEqual(len(c.completions.create(model="x", prompt="Hi", max_tokens=3).choices), 1)


class JinjaChatTemplate(unittest.TestCase):
    """--chat-template-file: the server renders chat through a Jinja template, and a template
    that refuses the messages (raise_exception) answers 400 naming why."""

    TEMPLATE = (
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system turns here') }}{% endif %}"
        "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )

    def test_chat_through_a_jinja_file(self):
        path = os.path.join(tempfile.mkdtemp(), "chat.jinja")
        with open(path, "w") as f:
            f.write(self.TEMPLATE)
        with Server("--chat-template-file", path) as s:
            c = s.openai()
            r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Once"}], max_tokens=4,
                                          temperature=0)
            self.assertEqual(len(r.choices), 1)
            # "user: Once\nassistant:" as the prompt: the same tokens as that completion prompt.
            self.assertEqual(r.usage.prompt_tokens,
                             c.completions.create(model="x", prompt="user: Once\nassistant:", max_tokens=1).usage.prompt_tokens
                             - 1)  # completions add BOS; the template writes none
            status, body = s.post("/v1/chat/completions",
                                  {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]})
            self.assertEqual(status, 400, body)
            self.assertEqual(body["error"]["code"], "chat_template_error")
            self.assertIn("no system turns here", body["error"]["message"])
            status, body = s.post("/apply-template", {"messages": [{"role": "user", "content": "Once"}]})
            self.assertEqual((status, body), (200, {"prompt": "user: Once\nassistant:"}))
            status, body = s.post("/apply-template", {"messages": [{"role": "system", "content": "x"}]})
            self.assertEqual(body["error"]["code"], "chat_template_error")


class JinjaTools(unittest.TestCase):
    """Tools and tool turns reach the template in the client's key order (/apply-template shows it)."""

    def test_tools_and_tool_turns_in_client_order(self):
        path = os.path.join(tempfile.mkdtemp(), "tools.jinja")
        with open(path, "w") as f:
            f.write("{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}"
                    "{{ m.tool_calls[0].function | tojson }}{% endif %}{% if m.tool_call_id %}@{{ m.tool_call_id }}"
                    "{% endif %}|{% endfor %}{{ tools | tojson }}")
        body = {"messages": [{"role": "user", "content": "Weather?"},
                             {"role": "assistant", "content": None, "tool_calls": [
                                 {"id": "c1", "type": "function",
                                  "function": {"name": "w", "arguments": "{\"zone\": \"x\", \"city\": \"Oslo\"}"}}]},
                             {"role": "tool", "tool_call_id": "c1", "content": "-3"}],
                "tools": [{"type": "function", "function": {"name": "w", "description": "d"}}]}
        with Server("--chat-template-file", path) as s:
            status, got = s.post("/apply-template", body)
            self.assertEqual(status, 200, got)
            self.assertEqual(got["prompt"],
                             'user:Weather?|assistant:{"name": "w", "arguments": {"zone": "x", "city": "Oslo"}}|'
                             'tool:-3@c1|[{"type": "function", "function": {"name": "w", "description": "d"}}]')
            r = s.openai().chat.completions.create(model="x", messages=body["messages"], tools=body["tools"],
                                                   max_tokens=2)
            self.assertEqual(len(r.choices), 1)


class Echo(unittest.TestCase):
    """Completions with `echo`: the prompt's text, then the completion, whole or streamed."""

    def test_echo_whole_and_streamed(self):
        with Server() as s:
            c = s.openai()
            plain = c.completions.create(model="x", prompt="Once upon", max_tokens=5, temperature=0)
            echoed = c.completions.create(model="x", prompt="Once upon", max_tokens=5, temperature=0, echo=True)
            self.assertEqual(echoed.choices[0].text, "Once upon" + plain.choices[0].text)
            self.assertEqual(echoed.usage.completion_tokens, plain.usage.completion_tokens)
            events = s.stream_events("/v1/completions", {"prompt": "Once upon", "max_tokens": 5, "temperature": 0,
                                                         "echo": True, "stream": True})
            self.assertEqual(completion_text(events)[0], echoed.choices[0].text)


class LogitBias(unittest.TestCase):
    """logit_bias: -100 bans a token, +100 forces it, greedy or sampled; ids beyond the
    vocabulary are refused."""

    def test_ban_force_and_refuse(self):
        with Server("--chat-template", "chatml") as s:
            c = s.openai()
            plain = c.completions.create(model="x", prompt="Once upon a", max_tokens=1, temperature=0)
            prefix = s.post("/tokenize", {"content": "Once upon a"})[1]["tokens"]
            first = s.post("/tokenize", {"content": "Once upon a" + plain.choices[0].text})[1]["tokens"][len(prefix)]
            banned = c.completions.create(model="x", prompt="Once upon a", max_tokens=1, temperature=0,
                                          logit_bias={str(first): -100})
            self.assertNotEqual(banned.choices[0].text, plain.choices[0].text)
            pieces = set()
            for temperature in (0, 1):  # +100 on one token: it wins every step, greedy or sampled
                forced = c.completions.create(model="x", prompt="Once upon a", max_tokens=3, temperature=temperature,
                                              logit_bias={"100": 100}, logprobs=0)
                pieces.update(forced.choices[0].logprobs.tokens)
            self.assertEqual(len(pieces), 1, pieces)
            for path, body in (("/v1/completions", {"prompt": "x"}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
                for token in ("100000", "99999999999"):
                    status, answer = s.post(path, {**body, "logit_bias": {token: 1}})
                    self.assertEqual(status, 400, answer)
                    self.assertEqual(answer["error"]["param"], "logit_bias")
                    self.assertIn("outside the vocabulary", answer["error"]["message"])


class TokenEndpoints(unittest.TestCase):
    """llama.cpp's /tokenize and /detokenize over the model's vocabulary."""

    def test_tokenize_detokenize_round_trip_and_refusals(self):
        with Server() as s:
            status, t = s.post("/tokenize", {"content": "Once upon a time"})
            self.assertEqual(status, 200, t)
            ids = t["tokens"]
            self.assertTrue(ids and all(isinstance(i, int) for i in ids))
            status, with_bos = s.post("/tokenize", {"content": "Once upon a time", "add_special": True})
            self.assertEqual(with_bos["tokens"], [1] + ids)  # stories260K's BOS
            status, pieces = s.post("/tokenize", {"content": "Once", "with_pieces": True})
            self.assertEqual([p["id"] for p in pieces["tokens"]], s.post("/tokenize", {"content": "Once"})[1]["tokens"])
            self.assertEqual("".join(p["piece"] for p in pieces["tokens"]).replace("\u2581", " ").strip(), "Once")
            status, d = s.post("/detokenize", {"tokens": ids})
            self.assertEqual((status, d["content"].strip()), (200, "Once upon a time"))
            for bad in ({"tokens": [100000]}, {"tokens": "x"}, {"tokens": [1.5]}, {}):
                status, body = s.post("/detokenize", bad)
                self.assertEqual(status, 400, (bad, body))
                self.assertEqual(body["error"]["param"], "tokens")
            status, body = s.post("/tokenize", {"content": 3})
            self.assertEqual(status, 400, body)
            status, body = s.post("/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
            self.assertEqual(body["error"]["code"], "chat_template_missing")


class GracefulShutdown(unittest.TestCase):
    def test_sigterm_drains_streams_and_exits_zero(self):
        # codelm at ~1000 tokens streams for a few seconds: long enough to probe the drain.
        s = Server("--ctx-size", "1024", model=CODELM)
        body = {"prompt": "def f(x):", "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        sock = s.open_stream(body)
        first = read_events(sock, 1)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # While the stream drains, new work is refused and /health says so.
        status, answer = s.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
        self.assertEqual(status, 503, answer)
        self.assertEqual(answer["error"]["type"], "server_error")
        self.assertEqual(s.request("GET", "/health")[0], 503)
        rest = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
            if b"data: [DONE]" in rest:
                break
        sock.close()
        self.assertEqual(s.stop(), 0)
        self.assertIn(b"data: [DONE]", rest)
        self.assertIn(b'"finish_reason":"length"', rest)
        # The request ran to its end: all 1000 tokens.
        self.assertIn(b'"completion_tokens":1000', rest)
        self.assertIn("draining", "".join(s.stderr_lines))

    def test_sigint_exits_zero(self):
        s = Server()
        self.assertEqual(s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})[0], 200)
        self.assertEqual(s.stop(signal.SIGINT), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
