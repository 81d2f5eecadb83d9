"""Fakes for the profile's measuring logic (batcher/profile): a clock a test moves by hand, and the
reference's token ids as fake engines answer them."""

from __future__ import annotations

from batcher.profile import fidelity

REFERENCE = [[i] * fidelity.MAX_TOKENS for i in range(len(fidelity.PROMPTS))]


class Clock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now
