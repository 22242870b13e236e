"""Prefix sharing end to end: requests with a long shared system prompt compute it once;
the prefill tokens saved and the hit rate in /metrics match the shared share, and every
output equals the output of a server without a prefix cache."""
import unittest

from server_harness import Server

SYSTEM = ("You are a storyteller. Tell short, happy stories about children, animals and "
          "their friends. Use simple words. Every story has a beginning, a middle and an end. ") * 4
QUESTIONS = ["Tell me about a cat.", "Tell me about a red ball.", "What did Lily find?",
             "Why was Tom sad?", "Where did the bird go?", "Who lived in the big tree?"]


def run(server: Server):
    before = server.metrics()
    texts, usages = [], []
    for q in QUESTIONS:  # one after another: each finds the earlier ones' blocks cached
        status, body = server.post("/v1/completions",
                                   {"prompt": SYSTEM + q, "max_tokens": 24, "temperature": 0})
        assert status == 200, body
        texts.append(body["choices"][0]["text"])
        usages.append(body["usage"])
    after = server.metrics()
    delta = {k: after[k] - before.get(k, 0.0) for k in after if k.endswith("_total")}
    return texts, usages, delta


class PrefixSharing(unittest.TestCase):
    def test_shared_system_prompt_is_computed_once(self):
        with Server("--block-size", "16") as shared, Server("--no-prefix-cache") as plain:
            texts, usages, d = run(shared)
            plain_texts, plain_usages, pd = run(plain)
            self.assertEqual(texts, plain_texts)
            prompt_tokens = sum(u["prompt_tokens"] for u in usages)
            cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
            # The first request computes everything; every later one reuses the whole blocks
            # of the system prompt (at least all but the block where the question starts).
            system_len = min(u["prompt_tokens"] for u in usages) - 12
            self.assertEqual(cached[0], 0)
            for c in cached[1:]:
                self.assertGreaterEqual(c, (system_len // 16 - 1) * 16)
                self.assertEqual(c % 16, 0)
            # Prefill work drops by exactly the tokens served from the cache...
            self.assertEqual(pd["flashdllm_prefill_tokens_computed_total"], prompt_tokens)
            self.assertEqual(d["flashdllm_prefill_tokens_computed_total"], prompt_tokens - sum(cached))
            # ...and /metrics' hit counters and rate say the same.
            self.assertEqual(d["flashdllm_prefix_cache_hits_total"], sum(cached))
            self.assertEqual(d["flashdllm_prefix_cache_queries_total"], prompt_tokens)
            m = shared.metrics()
            self.assertAlmostEqual(m["flashdllm_prefix_cache_hit_rate"],
                                   m["flashdllm_prefix_cache_hits_total"] /
                                   m["flashdllm_prefix_cache_queries_total"], places=6)
            self.assertGreater(sum(cached) / prompt_tokens, 0.6)


class DisconnectDuringPrefill(unittest.TestCase):
    def test_client_gone_during_a_long_prefill_frees_everything(self):
        # Small steps make the ~1000-token prompt take many forwards to prefill; the client
        # leaves before its first token.
        with Server("--max-num-seqs", "2", "--max-num-batched-tokens", "16",
                    "--no-prefix-cache") as s:
            total = s.metrics()["flashdllm_kv_blocks_total"]
            body = {"prompt": SYSTEM * 3, "max_tokens": 500, "temperature": 0}
            for _ in range(20):
                sock = s.open_stream(body)
                sock.close()
            m = s.wait_idle(timeout=1.0)
            self.assertEqual(m["flashdllm_requests_running"], 0)
            self.assertEqual(m["flashdllm_requests_waiting"], 0)
            self.assertEqual(m["flashdllm_kv_blocks_free"], total)
            self.assertGreaterEqual(m.get('flashdllm_requests_finished_total{finish_reason="abort"}', 0), 20)
            status, _ = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8})
            self.assertEqual(status, 200)


if __name__ == "__main__":
    unittest.main()
