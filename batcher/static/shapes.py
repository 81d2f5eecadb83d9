"""A compiled round's fixed shapes: one decode graph per (width, cache length), so that a few
graphs serve every round. A round of 2 or more rows is padded to the batch size (`graph_width`)
and its static KV cache is a power of two from 64 (`cache_bucket`)."""

from __future__ import annotations

import torch
from transformers import StaticCache

from batcher.sampling import SamplingParams
from batcher.sequence import Sequence

Shape = tuple[int, int]  # (rows, cache length): one compiled graph


def graph_width(rows: int, max_batch: int) -> int:
    """A compiled round's rows: one prompt alone (its own, cheaper graph), more padded to `max_batch`."""
    return 1 if rows == 1 else max_batch


def cache_bucket(needed: int, ceiling: int) -> int:
    """A static cache's length: the next power of two from 64 (a few graphs; short rounds stay short)."""
    return min(max(64, 1 << (needed - 1).bit_length()), ceiling)


def pad_rows(seqs: list[Sequence], inputs: dict[str, torch.Tensor], width: int):
    """The round padded to `width` rows with throwaway copies of its first row (one token each,
    never returned)."""
    fill = width - len(seqs)
    if fill > 0:
        seqs = seqs + [Sequence(seqs[0].prompt, SamplingParams(max_tokens=1)) for _ in range(fill)]
        inputs = {k: torch.cat([v, v[:1].expand(fill, -1)]) for k, v in inputs.items()}
    return seqs, inputs


def static_cache(model, rows: int, length: int, device: str) -> StaticCache:
    """The round's KV cache, made before the prefill. On a CPU its tensors are not marked as
    static addresses, as transformers marks them for CUDA graphs: Inductor's freezing takes a static
    input for a parameter and folds it into the graph as a constant, so that every step would read
    the cache as it was at compile time (seen: an index out of bounds, when dense graphs froze).
    transformers leaves them unmarked while torch says it compiles, and that flag is process-wide:
    a cache made while vLLM compiles in its own thread has no mark to remove."""
    config = model.config
    cache = StaticCache(config=config, max_cache_len=length)
    if device == "cpu":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        cache.early_initialization(rows, config.num_key_value_heads, head_dim, model.dtype, device)
        for layer in cache.layers:
            for tensor in (layer.keys, layer.values, layer.cumulative_length):
                tensor.__dict__.pop("_dynamo_static_input_type", None)  # torch._dynamo.mark_static_address's mark
    return cache
