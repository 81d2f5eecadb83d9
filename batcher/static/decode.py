"""Our own generate(), in gpt-fast's shape: one prefill over the round's prompts, then one token a
step (`next_logits`) over the round's KV cache until every row is done. The model thread runs one
per round (batcher/static/runner.py).

Why not transformers' generate(): its loop builds each step's 4-D attention mask, position ids and
model inputs in Python around the compiled step, and it asks the stopping
criteria before handing the streamer the step's tokens, so a round ran one step more than its rows
needed. Here a step is the model's forward alone, compiled whole where the round compiles (its mask
is built inside the graph from a fixed-width 2-D one); the per-row hooks are the same objects
(batcher/static/processors.py's logits processors, RoundRows as streamer and stopping criteria).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from batcher.static.rows import RoundRows


def next_logits(model, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
    """One step of every row: its last token in ([B, 1] at `positions`), its next token's logits out
    ([B, V], fp32). `mask`: [B, cache length] for a static cache (ones past the prompt: the causal
    rule hides what is not written yet), [B, tokens so far] for a dynamic one."""
    out = model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache, logits_to_keep=1)
    return out.logits[:, -1].float()


def generate(
    model,
    step,
    inputs: dict[str, torch.Tensor],
    cache,
    processors: LogitsProcessorList,
    rows: RoundRows,
    sample: bool,
    pad_id: int,
    max_new_tokens: int,
) -> None:
    """Run one round: `step` is `next_logits`, compiled or not; `cache` is empty, or holds the
    prompts' first tokens (a kept prefix: batcher/static/prefix.py), which are not prefilled again.
    Each row's tokens reach `rows` as they come; a done row gets `pad_id` until the round ends."""
    ids, padding = inputs["input_ids"], inputs["attention_mask"]  # [B, S], left-padded
    width, length = ids.shape
    capacity = cache.get_max_length()  # a static cache's length; -1: a dynamic cache, which grows
    static = capacity > 0
    extra = capacity - length if static else max_new_tokens
    mask = torch.cat([padding, padding.new_ones(width, extra)], dim=-1)
    positions = padding.long().cumsum(-1) - 1  # each row counts its own tokens, left padding off
    positions.masked_fill_(padding == 0, 1)
    past = int(cache.get_seq_length())
    logits = next_logits(model, ids[:, past:], mask if static else mask[:, :length], positions[:, past:], cache)
    position = positions[:, -1:]
    unfinished = torch.ones(width, dtype=torch.bool, device=ids.device)
    for t in range(max_new_tokens):
        scores = processors(ids, logits.clone())  # CUDA graphs hand back one buffer at every step
        if sample:
            tokens = torch.multinomial(scores.softmax(dim=-1), num_samples=1).squeeze(1)
        else:
            tokens = scores.argmax(dim=-1)
        tokens = torch.where(unfinished, tokens, pad_id)
        ids = torch.cat([ids, tokens[:, None]], dim=-1)
        rows.put(tokens)
        unfinished &= ~rows(ids, scores)
        if t + 1 == max_new_tokens or not bool(unfinished.any()):
            return
        position = position + 1
        logits = step(model, tokens[:, None], mask if static else mask[:, : length + t + 1], position, cache)
