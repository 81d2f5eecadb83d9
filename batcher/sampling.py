"""SamplingParams: what one prompt asks of the engine, per prompt even inside one round."""

from __future__ import annotations

from dataclasses import dataclass

from batcher.grammar import StructuredSpec


@dataclass(frozen=True)
class SamplingParams:
    """Per prompt, even inside one round. temperature 0 means greedy. Meanings and ranges are
    vLLM's (the request models validate them, service/protocol/); the neutral defaults change nothing."""

    max_tokens: int = 20
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks: equal work on every path)
    stop: tuple[str, ...] = ()  # end when the text contains one; it is cut off, reason "stop"
    stop_token_ids: tuple[int, ...] = ()  # end on one of these tokens (not returned), reason "stop"
    seed: int | None = None  # sampled rows draw from their own generator: reproducible per engine
    logprobs: int | None = None  # top alternatives per generated token; None: no logprobs at all
    prompt_logprobs: int | None = None  # top alternatives per prompt token; None: none computed
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = -1  # -1 (or 0): every token
    min_p: float = 0.0
    min_tokens: int = 0  # EOS, stop_token_ids and stop strings only count after this many tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted by id
    structured: StructuredSpec | None = None  # the text's grammar, compiled as it is enqueued (batcher/grammar.py)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return (self.presence_penalty, self.frequency_penalty, self.repetition_penalty) != (0.0, 0.0, 1.0)
