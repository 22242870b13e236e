"""Secure defaults of `flashdllm serve`: API keys from a file or the environment, several keys
with their own prefix-cache scopes, /metrics behind the key (unless --metrics-public), 500s
that name a request id instead of the failure, and --max-queue's 429 with Retry-After.
Everything binds 127.0.0.1 only."""
import json
import os
import re
import tempfile
import time
import unittest

from server_harness import CODELM, STORIES, Server, model_path, run_serve

SYSTEM = ("You are a storyteller. Tell short, happy stories about children, animals and "
          "their friends. Use simple words. ") * 4


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


class KeyFile:
    """A temporary key file holding `text`."""

    def __init__(self, text):
        fd, self.path = tempfile.mkstemp(prefix="flashdllm-key-")
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        os.unlink(self.path)


def one_line_error(test, result, *needles, status=1):
    test.assertEqual(result.returncode, status, result.stderr)
    lines = result.stderr.strip().splitlines()
    test.assertEqual(len(lines), 1, result.stderr)
    for needle in needles:
        test.assertIn(needle, lines[0])


class ApiKeySources(unittest.TestCase):
    def assert_key_required(self, s, key):
        self.assertEqual(s.request("GET", "/v1/models")[0], 401)
        self.assertEqual(s.request("GET", "/v1/models", headers=bearer("wrong"))[0], 401)
        self.assertEqual(s.request("GET", "/v1/models", headers=bearer(key))[0], 200)

    def test_key_file_first_line_with_trailing_newline(self):
        with KeyFile("from-file-key \n") as path, Server("--api-key-file", path) as s:
            self.assert_key_required(s, "from-file-key")

    def test_environment_when_no_flag_is_given(self):
        with Server(env={"FLASHDLLM_API_KEY": "from-env-key"}) as s:
            self.assert_key_required(s, "from-env-key")
        # A flag wins over the environment.
        with Server("--api-key", "flag-key", env={"FLASHDLLM_API_KEY": "from-env-key"}) as s:
            self.assert_key_required(s, "flag-key")
            self.assertEqual(s.request("GET", "/v1/models", headers=bearer("from-env-key"))[0], 401)

    def test_bad_key_sources_are_one_line_errors(self):
        one_line_error(self, run_serve("--api-key-file", "/nonexistent/keys"), "--api-key-file", "cannot open")
        with KeyFile("") as empty:
            one_line_error(self, run_serve("--api-key-file", empty), "--api-key-file", "empty")
        with KeyFile("\n  \n") as blank:
            one_line_error(self, run_serve("--api-key-file", blank), "--api-key-file", "blank lines")
        with KeyFile("k\n") as path:  # a usage error, as every conflict of flags (exit status 2)
            one_line_error(self, run_serve("--api-key", "k", "--api-key-file", path), "--api-key", status=2)
        one_line_error(self, run_serve("--api-key", "has space"), "whitespace")

    def test_loopback_without_a_key_is_not_warned_about(self):
        with Server() as s:
            pass
        self.assertFalse([l for l in s.stderr_lines if "not a loopback" in l], s.stderr_lines)


class ProtectedEndpoints(unittest.TestCase):
    def test_metrics_and_admin_need_the_key_health_does_not(self):
        with Server("--api-key", "k") as s:
            for path in ("/metrics", "/admin/breakers", "/v1/models"):
                status, _, data = s.request("GET", path)
                self.assertEqual(status, 401, path)
                self.assertEqual(json.loads(data)["error"]["code"], "invalid_api_key")
                self.assertEqual(s.request("GET", path, headers=bearer("k"))[0], 200, path)
            for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/apply-template"):
                self.assertEqual(s.request("POST", path, {"prompt": "x"})[0], 401, path)
            self.assertEqual(s.request("GET", "/health")[0], 200)
            self.assertIn("flashdllm_requests_running", s.metrics(bearer("k")))

    def test_metrics_public_opens_metrics_only(self):
        with Server("--api-key", "k", "--metrics-public") as s:
            self.assertEqual(s.request("GET", "/metrics")[0], 200)
            self.assertEqual(s.request("GET", "/admin/breakers")[0], 401)
            self.assertEqual(s.request("GET", "/v1/models")[0], 401)


class PerKeyCacheScopes(unittest.TestCase):
    def check_scopes(self, s, key_a, key_b):
        body = {"prompt": SYSTEM + "Tell me about a cat.", "max_tokens": 8, "temperature": 0}
        status, a = s.post("/v1/completions", body, bearer(key_a))
        self.assertEqual(status, 200, a)
        hits_before_b = s.metrics(bearer(key_a))["flashdllm_prefix_cache_hits_total"]
        _, b = s.post("/v1/completions", body, bearer(key_b))
        self.assertEqual(s.metrics(bearer(key_a))["flashdllm_prefix_cache_hits_total"], hits_before_b)
        _, a2 = s.post("/v1/completions", body, bearer(key_a))
        cached = lambda r: r["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.assertEqual(cached(a), 0)
        self.assertEqual(cached(b), 0)  # B never reads what A's identical prompt cached
        self.assertGreater(cached(a2), 0)  # A does
        _, b2 = s.post("/v1/completions", body, bearer(key_b))
        self.assertGreater(cached(b2), 0)  # and B its own
        self.assertEqual(len({r["choices"][0]["text"] for r in (a, b, a2, b2)}), 1)

    def test_repeated_api_key_flags(self):
        with Server("--api-key", "key-a", "--api-key", "key-b") as s:
            self.check_scopes(s, "key-a", "key-b")

    def test_key_file_with_one_key_per_line(self):
        with KeyFile("key-a\nkey-b\n") as path, Server("--api-key-file", path) as s:
            self.check_scopes(s, "key-b", "key-a")

    def test_without_keys_one_scope_is_shared(self):
        with Server() as s:
            body = {"prompt": SYSTEM + "Tell me about a dog.", "max_tokens": 4, "temperature": 0}
            s.post("/v1/completions", body, bearer("tenant-a"))
            _, b = s.post("/v1/completions", body, bearer("tenant-b"))
            self.assertGreater(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0)


class MaxQueue(unittest.TestCase):
    def test_requests_beyond_the_queue_get_429_until_it_drains(self):
        # codelm generating ~1000 tokens runs for seconds: one runs, two wait, the next is refused.
        with Server("--ctx-size", "1024", "--max-num-seqs", "1", "--max-num-batched-tokens", "64",
                    "--max-queue", "2", model=CODELM) as s:
            body = {"prompt": "def f(x):", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}
            # The first request may finish before the other two are queued behind it (a fast
            # machine generates the 1000 tokens in under a second): then the scene is set again.
            for _ in range(5):
                socks = [s.open_stream(body)]
                deadline = time.monotonic() + 30
                while s.metrics()["flashdllm_requests_running"] < 1:
                    self.assertLess(time.monotonic(), deadline)
                    time.sleep(0.02)
                socks += [s.open_stream(body), s.open_stream(body)]
                queued_by = time.monotonic() + 3
                while s.metrics()["flashdllm_requests_waiting"] < 2 and time.monotonic() < queued_by:
                    time.sleep(0.02)
                if s.metrics()["flashdllm_requests_waiting"] >= 2:
                    break
                for sock in socks:
                    sock.close()
                m = s.wait_idle(timeout=30.0)
                self.assertEqual(m["flashdllm_requests_running"] + m["flashdllm_requests_waiting"], 0)
            else:
                self.fail("two requests never waited behind the running one")
            # A request of a scene given up may reach the queue late and be refused there: count
            # only the refusals of the two requests below.
            rejected = 'flashdllm_requests_rejected_total{reason="queue_full"}'
            rejected_before = s.metrics().get(rejected, 0)
            for stream in (False, True):
                status, headers, data = s.request("POST", "/v1/completions", dict(body, stream=stream))
                self.assertEqual(status, 429, data)
                self.assertGreaterEqual(int(headers["Retry-After"]), 1)
                err = json.loads(data)["error"]
                self.assertEqual(err["code"], "rate_limit_exceeded")
                self.assertIn("--max-queue", err["message"])
            self.assertEqual(s.metrics()[rejected], rejected_before + 2)
            for sock in socks:  # the clients leave: their requests are aborted
                sock.close()
            m = s.wait_idle(timeout=5.0)
            self.assertEqual(m["flashdllm_requests_waiting"], 0)
            status, answer = s.post("/v1/completions", {"prompt": "def g():", "max_tokens": 4})
            self.assertEqual(status, 200, answer)


class LargeBodies(unittest.TestCase):
    def test_objects_of_many_keys_take_linear_time(self):
        # 60,000 keys in one object (a 1.5 MB body): nlohmann's ordered parse alone would search
        # every key among those before it, tens of seconds; the answer comes in about one.
        n = 60000
        args = json.dumps({f"a{i}": i for i in range(n)})
        tools = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}}}]
        template = os.path.join(os.path.dirname(model_path(STORIES)), "..", "chat-templates", "templates",
                                "Qwen-Qwen2.5-7B-Instruct.jinja")
        with Server("--max-body-bytes", str(8 << 20), "--chat-template-file", template, model=STORIES) as s:
            for body in (
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "tools": tools},
                    {"messages": [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": None, "tool_calls": [
                                      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]},
                                  {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
                     "max_tokens": 1, "tools": [{"type": "function", "function": {"name": "f"}}]}):
                start = time.monotonic()
                status, answer = s.post("/v1/chat/completions", body)
                self.assertLess(time.monotonic() - start, 10.0)
                self.assertEqual(status, 400, answer)  # far longer than the model's context
                self.assertEqual(answer["error"]["code"], "context_length_exceeded")


if __name__ == "__main__":
    unittest.main(verbosity=2)
