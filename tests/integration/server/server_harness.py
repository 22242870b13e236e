"""Shared helpers for the `flashdllm serve` integration tests.

Starts the real binary (``$FLASHDLLM_BIN``, else ``build/bin/flashdllm``) on 127.0.0.1 with
``--port 0`` and reads the chosen port from its ``flashdllm: listening on http://HOST:PORT``
line. Models come from ``$FLASHDLLM_SHARED/models`` (else ``../shared/models`` beside the
checkout). Everything talks to loopback only.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Loopback traffic must never go through a proxy from the environment.
os.environ["NO_PROXY"] = "127.0.0.1,localhost"
os.environ["no_proxy"] = "127.0.0.1,localhost"


def child_env(changes: dict | None) -> dict:
    """This environment with `changes` applied (None removes a variable); the variables that
    configure secrets are removed unless `changes` sets them, so a developer's shell cannot
    change what a test sees."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLASHDLLM_API_KEY", "FLASHDLLM_REDIS_PASSWORD", "FLASHDLLM_REDIS_USER")}
    for k, v in (changes or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_serve(*args: str, env: dict | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """`flashdllm serve ARGS` for a command that must fail before listening."""
    return subprocess.run([flashdllm_bin(), "serve", "-m", model_path(STORIES), "--port", "0", "-t", "1", *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                          env=child_env(env))


def flashdllm_bin() -> str:
    return os.environ.get("FLASHDLLM_BIN") or str(ROOT / "build" / "bin" / "flashdllm")


def model_path(name: str) -> str:
    shared = os.environ.get("FLASHDLLM_SHARED") or str(ROOT.parent / "shared")
    return str(Path(shared) / "models" / name)


STORIES = "stories260K.gguf"
CODELM = "codelm-16m-f16.gguf"


class Server:
    """One `flashdllm serve` child process. Use as a context manager."""

    def __init__(self, *args: str, model: str = STORIES, start_timeout: float = 60.0, env: dict | None = None):
        """`env`: variables added to (or, with None values, removed from) the environment."""
        cmd = [flashdllm_bin(), "serve", "-m", model_path(model), "--port", "0", "-t", "1", *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace",
                                     env=child_env(env))
        self.stderr_lines: list[str] = []
        self.port = None
        deadline = time.monotonic() + start_timeout
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("server exited before listening:\n" + "".join(self.stderr_lines))
            self.stderr_lines.append(line)
            m = re.search(r"flashdllm: listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in time")
        # Keep draining stderr so the child never blocks on a full pipe.
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        self.proc.stderr.close()
        return self.proc.returncode

    # -- clients -----------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def openai(self, api_key: str = "unused", **kw):
        import openai
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=api_key, max_retries=0,
                             timeout=kw.pop("timeout", 120.0), **kw)

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 120.0):
        """Raw HTTP: returns (status, response headers dict, body bytes). `body` may be bytes,
        str (sent as is) or any other JSON value (serialized)."""
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            hdrs = {"Content-Type": "application/json"}
            hdrs.update(headers or {})
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def post(self, path: str, body, headers=None):
        """POST and decode the JSON answer strictly (UTF-8 must be valid)."""
        status, _, data = self.request("POST", path, body, headers)
        return status, json.loads(data.decode("utf-8"))

    def stream_events(self, path: str, body) -> list:
        """POST a streaming request; returns the decoded `data:` payloads (the final
        "[DONE]" as the string "[DONE]"). Comment lines are skipped, as SSE clients do."""
        status, headers, data = self.request("POST", path, body)
        assert status == 200, (status, data[:500])
        assert headers.get("Content-Type", "").startswith("text/event-stream"), headers
        events = []
        for block in data.decode("utf-8").split("\n\n"):
            if not block or block.startswith(":"):
                continue
            assert block.startswith("data: "), repr(block[:200])
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def metrics(self, headers=None) -> dict:
        """GET /metrics parsed into {'name{labels}': value}."""
        status, _, data = self.request("GET", "/metrics", headers=headers)
        assert status == 200
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def wait_idle(self, timeout: float = 1.0) -> dict:
        """Polls /metrics until no request runs or waits and no KV block is held by a request;
        returns the last metrics (the caller asserts on them)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (m["flashdllm_requests_running"] == 0 and m["flashdllm_requests_waiting"] == 0
                    and m["flashdllm_kv_blocks_used"] == 0)
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.02)

    def open_stream(self, body: dict) -> socket.socket:
        """Starts a streaming request on a raw socket (so the test can vanish mid-stream)."""
        payload = json.dumps(dict(body, stream=True)).encode()
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " +
                     str(len(payload)).encode() + b"\r\n\r\n" + payload)
        return sock


def read_events(sock: socket.socket, count: int) -> bytes:
    """Reads from a raw streaming socket until `count` SSE data events have arrived."""
    data = b""
    while data.count(b"data: ") < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def completion_text(events: list) -> dict:
    """Concatenated streamed text per choice index, for completions or chat chunks."""
    texts = {}
    for ev in events:
        if ev == "[DONE]" or not ev.get("choices"):
            continue
        for ch in ev["choices"]:
            piece = ch["text"] if "text" in ch else (ch["delta"].get("content") or "")
            texts[ch["index"]] = texts.get(ch["index"], "") + piece
    return texts


def resp(*args: str) -> bytes:
    """One command in the Redis protocol."""
    msg = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a.encode()
        msg += b"$" + str(len(b)).encode() + b"\r\n" + b + b"\r\n"
    return msg


def redis_command(port: int, *args: str, password: str | None = None) -> bytes:
    """One RESP command to a local redis-server (after AUTH when `password` is given);
    returns the raw reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        if password is not None:
            s.sendall(resp("AUTH", password))
            assert s.recv(4096).startswith(b"+OK"), "AUTH failed"
        s.sendall(resp(*args))
        return s.recv(4096)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
