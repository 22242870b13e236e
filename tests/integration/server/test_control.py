"""Breakers at run time: /admin/breakers (and API-key auth on /v1/* and /admin/*), and the
Redis Pub/Sub control channel through a real redis-server started here on loopback."""
import json
import shutil
import subprocess
import time
import unittest

import openai

from server_harness import Server, free_port, redis_command


def breaker(server, name, headers=None):
    status, _, data = server.request("GET", "/admin/breakers", headers=headers)
    assert status == 200, data
    return next(b for b in json.loads(data)["breakers"] if b["name"] == name)


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


@unittest.skipUnless(shutil.which("redis-server"), "redis-server is not installed")
class RedisControl(unittest.TestCase):
    def test_breakers_follow_redis_and_survive_its_death(self):
        port = free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    if redis_command(port, "PING").startswith(b"+PONG"):
                        break
                except OSError:
                    pass
                self.assertLess(time.monotonic(), deadline, "redis-server did not start")
                time.sleep(0.05)
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
            if redis.poll() is None:
                redis.kill()
                redis.wait()


if __name__ == "__main__":
    unittest.main(verbosity=2)
