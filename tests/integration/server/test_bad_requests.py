"""Bad input: every case is a 4xx with an OpenAI error body, and the server keeps serving the
same greedy output afterwards. Edge values that are accepted are checked too (docs/SERVER.md
lists the decisions). The server runs with --ctx-size 256 and --max-body-bytes 65536."""
import json
import socket
import time
import unittest

from server_harness import Server

CTX = 256
NORMAL = {"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
CHAT_OK = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def comp(**kw):
    body = dict(NORMAL)
    body.update(kw)
    return body


def chat(**kw):
    body = dict(CHAT_OK)
    body.update(kw)
    return body


# (name, path, body (dict = JSON, str/bytes = sent raw), expected status, expected param or None)
BAD = [
    ("max_tokens 0", "/v1/completions", comp(max_tokens=0), 400, "max_tokens"),
    ("max_tokens -1", "/v1/completions", comp(max_tokens=-1), 400, "max_tokens"),
    ("max_tokens 'ten'", "/v1/completions", comp(max_tokens="ten"), 400, "max_tokens"),
    ("max_tokens 1.5", "/v1/completions", comp(max_tokens=1.5), 400, "max_tokens"),
    ("max_tokens 'ten' + echo", "/v1/completions", comp(max_tokens="ten", echo=True), 400, "max_tokens"),
    ("max_tokens -1 + logprobs", "/v1/completions", comp(max_tokens=-1, logprobs=2), 400, "max_tokens"),
    ("max_tokens 0 + echo + logprobs", "/v1/completions", comp(max_tokens=0, echo=True, logprobs=1), 400, "max_tokens"),
    ("echo with logprobs", "/v1/completions", comp(echo=True, logprobs=1), 400, "echo"),
    ("logprobs 6", "/v1/completions", comp(logprobs=6), 400, "logprobs"),
    ("logprobs true", "/v1/completions", comp(logprobs=True), 400, "logprobs"),
    ("suffix", "/v1/completions", comp(suffix="The end."), 400, "suffix"),
    ("best_of 3", "/v1/completions", comp(best_of=3), 400, "best_of"),
    ("prompt ''", "/v1/completions", comp(prompt=""), 400, "prompt"),
    ("prompt []", "/v1/completions", comp(prompt=[]), 400, "prompt"),
    ("prompt ['']", "/v1/completions", comp(prompt=[""]), 400, "prompt"),
    ("prompt [[]]", "/v1/completions", comp(prompt=[[]]), 400, "prompt"),
    ("prompt number", "/v1/completions", comp(prompt=42), 400, "prompt"),
    ("prompt null", "/v1/completions", comp(prompt=None), 400, "prompt"),
    ("two prompts", "/v1/completions", comp(prompt=["a", "b"]), 400, "prompt"),
    ("negative id", "/v1/completions", comp(prompt=[1, -1]), 400, "prompt"),
    ("id = n_vocab", "/v1/completions", comp(prompt=[1, 512]), 400, "prompt"),
    ("prompt = context", "/v1/completions", comp(prompt=[1] + [300] * (CTX - 1)), 400, "prompt"),
    ("prompt > context", "/v1/completions", comp(prompt=[1] + [300] * (CTX + 50)), 400, "prompt"),
    ("long text prompt", "/v1/completions", comp(prompt="Once upon a time " * 200), 400, "prompt"),
    ("temperature -1", "/v1/completions", comp(temperature=-1), 400, "temperature"),
    ("temperature NaN", "/v1/completions", '{"prompt": "Hi", "temperature": NaN}', 400, None),
    ("temperature Infinity", "/v1/completions", '{"prompt": "Hi", "temperature": Infinity}', 400, None),
    ("temperature 1e999", "/v1/completions", '{"prompt": "Hi", "temperature": 1e999}', 400, None),
    ("temperature 1e9", "/v1/completions", comp(temperature=1e9), 400, "temperature"),
    ("temperature string", "/v1/completions", comp(temperature="0.5"), 400, "temperature"),
    ("top_p 1.5", "/v1/completions", comp(top_p=1.5), 400, "top_p"),
    ("top_p -0.1", "/v1/completions", comp(top_p=-0.1), 400, "top_p"),
    ("top_k -1", "/v1/completions", comp(top_k=-1), 400, "top_k"),
    ("min_p 2", "/v1/completions", comp(min_p=2), 400, "min_p"),
    ("presence_penalty 3", "/v1/completions", comp(presence_penalty=3), 400, "presence_penalty"),
    ("repetition_penalty 0", "/v1/completions", comp(repetition_penalty=0), 400, "repetition_penalty"),
    ("stop 5 strings", "/v1/completions", comp(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("stop ''", "/v1/completions", comp(stop=""), 400, "stop"),
    ("n 0", "/v1/completions", comp(n=0), 400, "n"),
    ("n 17", "/v1/completions", comp(n=17), 400, "n"),
    ("seed string", "/v1/completions", comp(seed="42"), 400, "seed"),
    ("seed 10^23", "/v1/completions", '{"prompt": "Hi", "seed": 99999999999999999999999}', 400, "seed"),
    ("seed 1.5", "/v1/completions", comp(seed=1.5), 400, "seed"),
    ("stream 'yes'", "/v1/completions", comp(stream="yes"), 400, "stream"),
    ("stream_options without stream", "/v1/completions", comp(stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("logit_bias not a token id", "/v1/completions", comp(logit_bias={"five": 10}), 400, "logit_bias"),
    ("logit_bias over 100", "/v1/completions", comp(logit_bias={"5": 101}), 400, "logit_bias"),
    ("truncated JSON", "/v1/completions", '{"prompt": "Once upon', 400, None),
    ("empty body", "/v1/completions", "", 400, None),
    ("body is an array", "/v1/completions", "[]", 400, None),
    ("body is a string", "/v1/completions", '"Once upon a time"', 400, None),
    ("invalid UTF-8", "/v1/completions", b'{"prompt": "Once \xff\xfe upon"}', 400, None),
    ("deep nesting", "/v1/completions", '{"prompt": ' + "[" * 20000 + "]" * 20000 + "}", 400, None),
    ("body over the limit", "/v1/completions", json.dumps(comp(prompt="x" * 70000)), 413, None),
    ("chat: messages []", "/v1/chat/completions", chat(messages=[]), 400, "messages"),
    ("chat: messages missing", "/v1/chat/completions", {"model": "m"}, 400, "messages"),
    ("chat: role function", "/v1/chat/completions", chat(messages=[{"role": "function", "content": "x"}]), 400,
     "messages[0].role"),
    ("chat: a tool turn with the built-in chatml", "/v1/chat/completions",
     chat(messages=[{"role": "tool", "content": "x"}]), 400, "messages"),
    ("chat: image part", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "messages[0].content[0].type"),
    ("chat: content null", "/v1/chat/completions", chat(messages=[{"role": "user", "content": None}]), 400,
     "messages[0].content"),
    ("chat: top_logprobs without logprobs", "/v1/chat/completions", chat(top_logprobs=2), 400, "top_logprobs"),
    ("chat: top_logprobs 21", "/v1/chat/completions", chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("chat: tools with the built-in chatml", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "messages"),
    ("chat: tools without a name", "/v1/chat/completions", chat(tools=[{"type": "function"}]), 400, "tools"),
    ("chat: a tool of another type", "/v1/chat/completions",
     chat(tools=[{"type": "code_interpreter", "function": {"name": "f"}}]), 400, "tools"),
    ("chat: a tool without a type", "/v1/chat/completions", chat(tools=[{"function": {"name": "f"}}]), 400, "tools"),
    ("chat: a tool description that is not a string", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f", "description": 5}}]), 400, "tools"),
    ("chat: tool name with a space", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "get time"}}]), 400, "tools"),
    ("chat: tool name of 65 characters", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f" * 65}}]), 400, "tools"),
    ("chat: tool names repeated", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f"}}] * 2), 400, "tools"),
    ("chat: tool_choice required", "/v1/chat/completions", chat(tool_choice="required"), 400, "tool_choice"),
    ("chat: max_completion_tokens 0", "/v1/chat/completions", chat(max_completion_tokens=0), 400,
     "max_completion_tokens"),
    ("chat: too long", "/v1/chat/completions", chat(messages=[{"role": "user", "content": "Hi there " * 300}]), 400,
     "messages"),
]


class BadRequests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--ctx-size", str(CTX), "--max-body-bytes", "65536", "--chat-template", "chatml")
        status, body = cls.server.post("/v1/completions", NORMAL)
        assert status == 200, body
        cls.baseline = body["choices"][0]["text"]

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def assert_still_serving(self):
        status, body = self.server.post("/v1/completions", NORMAL)
        self.assertEqual(status, 200, body)
        self.assertEqual(body["choices"][0]["text"], self.baseline)

    def test_bad_requests(self):
        self.assertGreaterEqual(len(BAD), 30)
        for name, path, body, status, param in BAD:
            with self.subTest(name):
                got, _, data = self.server.request("POST", path, body)
                self.assertEqual(got, status, data[:300])
                err = json.loads(data.decode("utf-8"))["error"]
                self.assertIsInstance(err["message"], str)
                self.assertTrue(err["message"])
                self.assertNotIn("json.exception", err["message"])  # the JSON library's internal id
                self.assertEqual(err["type"], "invalid_request_error")
                self.assertIn("code", err)
                self.assertEqual(err["param"], param, err["message"])
                self.assert_still_serving()

    def test_malformed_content_length_is_answered_at_once(self):
        # Checked before the body is read: cpp-httplib alone waited 5 s on "-1" and read "1e3"
        # as a 1-byte body. Each answer arrives well under that, names the header, and tells
        # the client to close (the body was not read).
        body = json.dumps(NORMAL).encode()
        for value, status in (("-1", 400), ("1e3", 400), ("12abc", 400), ("99999999999999999999999", 400),
                              ("70000", 413)):
            with self.subTest(value):
                with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as sock:
                    start = time.monotonic()
                    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: " + value.encode() + b"\r\n\r\n" + body)
                    reply = b""
                    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                        chunk = sock.recv(65536)
                        if not chunk:
                            break
                        reply += chunk
                    elapsed = time.monotonic() - start
                head, _, payload = reply.partition(b"\r\n\r\n")
                self.assertTrue(head.startswith(b"HTTP/1.1 %d" % status), head)
                self.assertIn(b"Connection: close", head)
                self.assertLess(elapsed, 2.0)
                err = json.loads(payload)["error"]
                self.assertEqual(err["param"], "Content-Length" if status == 400 else None)
                self.assertIn(value[:20], err["message"] if status == 400 else value)
                self.assert_still_serving()

    def test_context_errors_say_so(self):
        _, body = self.server.post("/v1/completions", comp(prompt=[1] + [300] * (CTX - 1)))
        self.assertEqual(body["error"]["code"], "context_length_exceeded")
        self.assertIn(str(CTX), body["error"]["message"])

    def test_unknown_route_and_method(self):
        for method, path in (("POST", "/v1/nothing"), ("GET", "/")):
            status, _, data = self.server.request(method, path)
            self.assertEqual(status, 404)
            self.assertIn("error", json.loads(data))
        # A route asked with a method it does not take: 405 and the methods it takes.
        for method, path, allowed in (("GET", "/v1/completions", "POST"), ("DELETE", "/admin/breakers", "GET, POST"),
                                      ("POST", "/health", "GET"), ("PUT", "/v1/models/m", "GET")):
            status, headers, data = self.server.request(method, path)
            self.assertEqual(status, 405, path)
            self.assertEqual(headers.get("Allow"), allowed, path)
            self.assertIn(allowed, json.loads(data)["error"]["message"])
        self.assert_still_serving()

    def test_accepted_edge_values(self):
        ok = [
            comp(max_tokens=None),                       # null = the default (16)
            comp(temperature=1e-4),                      # tiny temperature: near-greedy, well defined
            comp(temperature=2),                         # OpenAI's upper bound
            comp(top_p=0),                               # only the most likely token
            comp(top_k=10 ** 6),                         # beyond the vocabulary = no truncation
            comp(max_tokens=10 ** 9),                    # capped by the context: ends with "length"
            comp(seed=-1),                               # any integer seed
            comp(prompt=[[1, 300, 301]]),                # one id array inside an array
            comp(frobnicate={"x": 1}),                   # unknown fields are ignored
            {"prompt": "Once upon a time", "max_tokens": 2},  # no model field
            comp(stop=None, logprobs=None, suffix=None, echo=False, user="u", n=None),
        ]
        for body in ok:
            with self.subTest(body=json.dumps(body)[:120]):
                status, data = self.server.post("/v1/completions", body)
                self.assertEqual(status, 200, data)
        status, data = self.server.post("/v1/completions", comp(max_tokens=None))
        self.assertEqual(data["usage"]["completion_tokens"], 16)
        status, data = self.server.post("/v1/completions", comp(top_p=0, temperature=1.0, seed=3))
        self.assertEqual(data["choices"][0]["text"], self.baseline)  # top_p 0 == greedy
        status, data = self.server.post("/v1/completions", comp(max_tokens=10 ** 9, ignore_eos=True))
        self.assertEqual(data["choices"][0]["finish_reason"], "length")
        self.assertEqual(data["usage"]["total_tokens"], CTX)

    def test_prompt_at_context_edges(self):
        # n_ctx - 1 prompt tokens: exactly one token fits.
        status, data = self.server.post("/v1/completions", comp(prompt=[1] + [300] * (CTX - 2)))
        self.assertEqual(status, 200, data)
        self.assertEqual(data["usage"]["prompt_tokens"], CTX - 1)
        self.assertEqual(data["usage"]["completion_tokens"], 1)
        self.assertEqual(data["choices"][0]["finish_reason"], "length")
        # n_ctx - 2: two tokens.
        status, data = self.server.post("/v1/completions", comp(prompt=[1] + [300] * (CTX - 3), ignore_eos=True))
        self.assertEqual(status, 200, data)
        self.assertEqual(data["usage"]["completion_tokens"], 2)
        # Streaming at the edge.
        events = self.server.stream_events("/v1/completions", comp(prompt=[1] + [300] * (CTX - 2), stream=True))
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2]["choices"][0]["finish_reason"], "length")
        self.assert_still_serving()


if __name__ == "__main__":
    unittest.main(verbosity=2)
