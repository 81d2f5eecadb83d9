"""A one-row round's KV cache, kept for the next one-row round whose prompt starts with the same
tokens (STATIC_PREFIX_CACHE): a conversation's next turn, whose prompt is every earlier turn and
a new question, then prefills only what is new. The round's generate() continues from a cache
it is handed (batcher/static/decode.py prefills past the cache's length), dynamic (eager) or static (compiled).

One cache, the last round's, bounded by the context (a model's layers x 2 x KV heads x head size x
4 bytes a token: 45 KiB for SmolLM2-135M, 94 MiB at 2,048 tokens); it is cut back to the prefix
the next prompt shares. A round of more rows, one that asks for its prompt's logprobs (read off
the prefill), or one whose compiled cache length differs drops it. Greedy text can differ from a
whole prefill by fp32 rounding (the prefill's matrix products are split in two): off by default."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, StaticCache

from batcher.sequence import Sequence

MIN_PREFIX = 32  # tokens shared, at least: below it (a chat template's head) a kept cache saves little


@dataclass
class Kept:
    ids: list[int]  # the prompt whose tokens the cache holds first
    cache: DynamicCache | StaticCache
    length: int | None  # a static cache's length (compiled rounds), None for a dynamic one


def shared(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def cut(cache: DynamicCache | StaticCache, length: int) -> None:
    """The cache back to its first `length` tokens."""
    if isinstance(cache, StaticCache):  # later positions are written over, and masked until then
        for layer in cache.layers:
            layer.cumulative_length.fill_(length)
    else:
        cache.crop(length - cache.get_seq_length())  # a negative count: that many tokens removed


class PrefixCache:
    def __init__(self, enabled: bool):
        self.enabled, self.min_prefix, self._kept = enabled, MIN_PREFIX, None  # both: a test's seams
        self.reused = 0  # prompt tokens not prefilled again, in all (tests, logs)

    def before(self, seqs: list[Sequence], inputs: dict[str, torch.Tensor], cache, length, config):
        """(the round's cache: the kept one where its prompt continues it, else `cache`, or a fresh
        dynamic one where that is None; what to keep after the round, or None)."""
        kept, self._kept = self._kept, None
        cache = cache if cache is not None else DynamicCache(config=config)
        if not self.enabled or len(seqs) != 1 or seqs[0].params.prompt_logprobs is not None:
            return cache, None
        ids = inputs["input_ids"][0].tolist()
        if kept is not None and kept.length == length:
            prefix = min(shared(kept.ids, ids), len(ids) - 1)  # at least one token to prefill
            if prefix >= self.min_prefix:
                cut(kept.cache, prefix)
                cache = kept.cache
                self.reused += prefix
        return cache, Kept(ids, cache, length)

    def after(self, kept: Kept | None) -> None:
        """The round ran: its cache is kept (a round that raised keeps none)."""
        self._kept = kept
