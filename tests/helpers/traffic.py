"""What the rolling restarts (tests/e2e/test_cluster.py, tests/e2e/test_hosts.py) send: greedy prompts of a
few tokens, whose expected texts each test learns first, and how a streamed reply is read."""

from __future__ import annotations

import json

MAX_TOKENS = 6
PROMPTS = [
    "The capital of France is",
    "Water boils at",
    "My favourite colour is",
    "The first man on the moon was",
    "A good breakfast has",
    "Two plus two is",
    "The ocean is",
    "Cats like to",
]


def sse_events(text: str) -> list[dict]:
    return [json.loads(chunk.removeprefix("data: ")) for chunk in text.split("\n\n") if chunk.strip()]
