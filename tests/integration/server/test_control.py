"""Breakers at run time: /admin/breakers (and API-key auth on /v1/* and /admin/*), and the
Redis Pub/Sub control channel through a real redis-server started here on loopback."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import openai

from server_harness import Server, free_port, redis_command, run_serve


def breaker(server, name, headers=None):
    status, _, data = server.request("GET", "/admin/breakers", headers=headers)
    assert status == 200, data
    return next(b for b in json.loads(data)["breakers"] if b["name"] == name)


class FaultInjection(unittest.TestCase):
    """POST /admin/faults exists only with --fault-injection and refuses what it cannot do."""

    def test_only_with_the_flag_and_bad_faults_are_refused(self):
        with Server() as s:
            self.assertEqual(s.request("POST", "/admin/faults", {"fault": "flip_bit"})[0], 404)
        disk = tempfile.mkdtemp(prefix="flashdllm-faults-")
        try:
            with Server("--fault-injection", "-c", "256", "--kv-host-bytes", "1MiB", "--kv-disk-path", disk,
                        "--kv-disk-bytes", "1MiB") as s:
                for body in ({"fault": "melt_cpu"}, {"fault": "flip_bit", "count": 0},
                             {"fault": "disk_read_eio", "count": 5000}, {"fault": 3}, {"count": 1},
                             {"fault": "flip_bit", "count": "2"}):
                    status, _, data = s.request("POST", "/admin/faults", body)
                    self.assertEqual(status, 400, body)
                    self.assertIn("message", json.loads(data)["error"])
                status, _, data = s.request("POST", "/admin/faults", {"fault": "disk_write_eio", "count": 2})
                self.assertEqual((status, json.loads(data)["applied"]), (200, 2))
                status, _, data = s.request("POST", "/admin/faults", {"fault": "flip_bit"})
                self.assertEqual((status, json.loads(data)["applied"]), (200, 0))  # nothing stored yet
                self.assertEqual(s.request("GET", "/health")[0], 200)
            # Without a disk tier a disk fault has nothing to act on.
            with Server("--fault-injection") as s:
                self.assertEqual(s.request("POST", "/admin/faults", {"fault": "disk_read_eio"})[0], 400)
        finally:
            shutil.rmtree(disk, ignore_errors=True)


class AdminBreakers(unittest.TestCase):
    def test_trip_and_reset_with_auth(self):
        key = "s3cret"
        auth = {"Authorization": f"Bearer {key}"}
        with Server("--api-key", key) as s:
            # Without or with a wrong key: 401 on /v1/* and /admin/*.
            for path in ("/v1/models", "/admin/breakers"):
                for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": key}):
                    status, _, data = s.request("GET", path, headers=headers)
                    self.assertEqual(status, 401, (path, headers))
                    self.assertEqual(json.loads(data)["error"]["code"], "invalid_api_key")
            status, _, _ = s.request("POST", "/admin/breakers", {"breaker": "speculation", "action": "trip"})
            self.assertEqual(status, 401)
            for path in ("/tokenize", "/detokenize", "/apply-template"):  # the tokenizer endpoints too
                self.assertEqual(s.request("POST", path, {"content": "x", "tokens": [1]})[0], 401, path)
                self.assertNotEqual(s.request("POST", path, {"content": "x", "tokens": [1], "messages": []},
                                              headers=auth)[0], 401, path)
            with self.assertRaises(openai.AuthenticationError):
                s.openai(api_key="wrong").completions.create(model="m", prompt="Hi", max_tokens=2)
            # The probe stays open; /metrics needs the key (--metrics-public opens it).
            self.assertEqual(s.request("GET", "/health")[0], 200)
            self.assertEqual(s.request("GET", "/metrics")[0], 401)
            self.assertEqual(s.request("GET", "/metrics", headers=auth)[0], 200)
            # The right key works for the API.
            r = s.openai(api_key=key).completions.create(model="m", prompt="Hi", max_tokens=2)
            self.assertEqual(len(r.choices), 1)

            names = {b["name"] for b in json.loads(s.request("GET", "/admin/breakers", headers=auth)[2])["breakers"]}
            self.assertEqual(names, {"speculation", "disk_offload"})
            for name in ("speculation", "disk_offload"):
                status, _, data = s.request("POST", "/admin/breakers",
                                            {"breaker": name, "action": "trip", "reason": "test"}, headers=auth)
                self.assertEqual(status, 200, data)
                b = breaker(s, name, auth)
                self.assertTrue(b["open"])
                self.assertEqual(b["reason"], "manual trip: test")  # the same form on both breakers
                self.assertEqual(s.metrics(auth)[f'flashdllm_breaker_open{{name="{name}"}}'], 1)
                # Requests are still served with the breaker open.
                self.assertEqual(s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, auth)[0], 200)
                status, _, _ = s.request("POST", "/admin/breakers", {"breaker": name, "action": "reset"}, headers=auth)
                self.assertEqual(status, 200)
                self.assertFalse(breaker(s, name, auth)["open"])
                self.assertEqual(s.metrics(auth)[f'flashdllm_breaker_open{{name="{name}"}}'], 0)
                # Without a reason the trip says where it came from.
                s.request("POST", "/admin/breakers", {"breaker": name, "action": "trip"}, headers=auth)
                self.assertEqual(breaker(s, name, auth)["reason"], "manual trip: via /admin/breakers")
                s.request("POST", "/admin/breakers", {"breaker": name, "action": "reset"}, headers=auth)
            for bad in ({"breaker": "warp_drive", "action": "trip"}, {"breaker": "speculation", "action": "explode"},
                        {"breaker": "speculation"}, "not json", {"breaker": "speculation", "action": "trip", "x": 1}):
                status, _, data = s.request("POST", "/admin/breakers", bad, headers=auth)
                self.assertEqual(status, 400, (bad, data))
                self.assertIn("error", json.loads(data))


def start_redis(port, *args):
    """redis-server on 127.0.0.1:`port`, answering (PONG or NOAUTH) before this returns."""
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            reply = redis_command(port, "PING")
            if reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH"):
                return redis
        except OSError:
            pass
        if time.monotonic() > deadline:
            redis.kill()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)


def stop_redis(redis):
    if redis.poll() is None:
        redis.kill()
        redis.wait()


def subscribers(port, channel, password=None):
    """How many clients listen on `channel`."""
    return int(redis_command(port, "PUBSUB", "NUMSUB", channel, password=password).split(b"\r\n")[-2][1:])


class RedisControl(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # A missing server fails the suite rather than skipping it: a skipped suite reads green.
        if not shutil.which("redis-server"):
            raise AssertionError("redis-server is not installed (scripts/install-deps.sh installs it)")

    def test_breakers_follow_redis_and_survive_its_death(self):
        port = free_port()
        redis = start_redis(port)
        try:
            channel = "flashdllm-control"
            with Server("--control-redis", f"redis://127.0.0.1:{port}/{channel}") as s:
                # PUBLISH answers with the number of subscribers: wait for the server's one.
                deadline = time.monotonic() + 10
                while redis_command(port, "PUBSUB", "NUMSUB", channel).split(b"\r\n")[-2] != b":1":
                    self.assertLess(time.monotonic(), deadline, "the server never subscribed")
                    time.sleep(0.05)

                def publish_and_wait(cmd, expect_open):
                    redis_command(port, "PUBLISH", channel, json.dumps(cmd))
                    deadline = time.monotonic() + 5
                    while breaker(s, cmd["breaker"])["open"] != expect_open:
                        self.assertLess(time.monotonic(), deadline, cmd)
                        time.sleep(0.02)

                publish_and_wait({"breaker": "disk_offload", "action": "trip", "reason": "disk alarm"}, True)
                self.assertIn("disk alarm", breaker(s, "disk_offload")["reason"])
                publish_and_wait({"breaker": "disk_offload", "action": "reset"}, False)
                publish_and_wait({"breaker": "speculation", "action": "trip"}, True)
                # A malformed message is ignored; the next good one still applies.
                redis_command(port, "PUBLISH", channel, "{not json")
                publish_and_wait({"breaker": "speculation", "action": "reset"}, False)

                redis.kill()
                redis.wait()
                time.sleep(0.3)
                for _ in range(5):
                    status, body = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 4})
                    self.assertEqual(status, 200, body)
                self.assertEqual(s.request("GET", "/health")[0], 200)
                self.assertEqual(s.stop(), 0)
        finally:
            stop_redis(redis)

    def test_password_from_a_file_or_the_environment(self):
        port = free_port()
        password = "redis-s3cret"
        redis = start_redis(port, "--requirepass", password)
        channel = "flashdllm-control"
        url = f"redis://127.0.0.1:{port}/{channel}"
        fd, path = tempfile.mkstemp(prefix="flashdllm-redis-")
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        try:
            for args, env in ((("--redis-password-file", path), None),
                              ((), {"FLASHDLLM_REDIS_PASSWORD": password}),
                              (("--redis-user", "default", "--redis-password-file", path), None)):
                with Server("--control-redis", url, *args, env=env) as s:
                    deadline = time.monotonic() + 10
                    while subscribers(port, channel, password) != 1:
                        self.assertLess(time.monotonic(), deadline, ("never subscribed", args, env))
                        time.sleep(0.05)
                    redis_command(port, "PUBLISH", channel, json.dumps({"breaker": "speculation", "action": "trip"}),
                                  password=password)
                    while not breaker(s, "speculation")["open"]:
                        self.assertLess(time.monotonic(), deadline, ("command not applied", args, env))
                        time.sleep(0.02)
            # Without the password, or with a wrong one: one clear line, and no subscription.
            for env, needle in ((None, "NOAUTH"), ({"FLASHDLLM_REDIS_PASSWORD": "wrong"}, "AUTH refused: WRONGPASS")):
                with Server("--control-redis", url, env=env) as s:
                    deadline = time.monotonic() + 10
                    while not any(needle in line for line in s.stderr_lines):
                        self.assertLess(time.monotonic(), deadline, s.stderr_lines)
                        time.sleep(0.05)
                    line = next(line for line in s.stderr_lines if needle in line)
                    self.assertIn(f"127.0.0.1:{port}", line)
                    self.assertEqual(subscribers(port, channel, password), 0)
                    self.assertEqual(s.request("GET", "/health")[0], 200)  # serving goes on
                    self.assertFalse(any(password in line for line in s.stderr_lines))
        finally:
            os.unlink(path)
            stop_redis(redis)

    def test_auth_flags_need_control_redis_and_a_user_needs_a_password(self):
        one = run_serve("--redis-user", "ops")
        self.assertEqual(one.returncode, 1, one.stderr)
        self.assertIn("--control-redis", one.stderr)
        two = run_serve("--control-redis", "redis://127.0.0.1:1/c", "--redis-user", "ops")
        self.assertEqual(two.returncode, 1, two.stderr)
        self.assertIn("no password", two.stderr)
        three = run_serve("--control-redis", "redis://127.0.0.1:1/c", "--redis-password-file", "/nonexistent/pw")
        self.assertEqual(three.returncode, 1, three.stderr)
        self.assertEqual(len(three.stderr.strip().splitlines()), 1, three.stderr)
        self.assertIn("--redis-password-file", three.stderr)
        with tempfile.NamedTemporaryFile("w", prefix="flashdllm-redis-") as empty:
            four = run_serve("--control-redis", "redis://127.0.0.1:1/c", "--redis-password-file", empty.name)
            self.assertEqual(four.returncode, 1, four.stderr)
            self.assertEqual(len(four.stderr.strip().splitlines()), 1, four.stderr)
            self.assertIn("is empty", four.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
