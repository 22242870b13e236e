"""Prometheus text exposition (what `flashdllm serve` answers on /metrics) as a dict.

Standard library only: the GPU machine's scripts import it too (bench/gpu/grammar_batch.py).
"""
from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


def parse(text: str) -> dict[str, float]:
    """{'name' or 'name{labels}': value} for every sample line; comments and blank lines skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out
