"""UTF-8 under stress: at temperature 2 stories260K samples byte-fallback tokens freely, so
raw bytes that are not valid UTF-8 on their own come out of the model. Every response must
still be valid UTF-8 JSON, and streamed text must equal non-streamed text for the same seed."""
import concurrent.futures as cf
import json
import unittest

from server_harness import Server, completion_text


def check_utf8_json(test, raw: bytes):
    text = raw.decode("utf-8")  # strict: raises on any invalid byte
    return json.loads(text)


class Utf8(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max-num-seqs", "8")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def both(self, body):
        """(non-streamed text, streamed text, finish reasons) for one request body."""
        status, _, raw = self.server.request("POST", "/v1/completions", body)
        self.assertEqual(status, 200, raw[:300])
        whole = check_utf8_json(self, raw)
        events = self.server.stream_events("/v1/completions", dict(body, stream=True))
        streamed = completion_text(events).get(0, "")
        finish = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"][0]["finish_reason"]]
        return whole["choices"][0]["text"], streamed, (whole["choices"][0]["finish_reason"], finish)

    def test_temperature_2_over_200_seeds(self):
        bodies = [{"prompt": "Once upon a time", "max_tokens": 48, "temperature": 2.0, "seed": seed,
                   "logprobs": 1} for seed in range(200)]
        with cf.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(self.both, bodies))
        replacement = 0
        for (whole, streamed, (reason, finishes)), body in zip(results, bodies):
            self.assertEqual(streamed, whole, body["seed"])
            self.assertEqual(finishes, [reason])
            replacement += "\ufffd" in whole
        # The sweep is meant to reach byte tokens: at least one ill-formed sequence must have
        # been produced (and rendered as U+FFFD) for the test to mean anything.
        self.assertGreater(replacement, 0)

    def test_max_tokens_sweep(self):
        for n in range(1, 65):
            body = {"prompt": "Once upon a time", "max_tokens": n, "temperature": 2.0, "seed": 1000 + n,
                    "ignore_eos": True}
            whole, streamed, (reason, finishes) = self.both(body)
            self.assertEqual(streamed, whole, n)
            self.assertEqual(reason, "length")
            self.assertEqual(finishes, ["length"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
