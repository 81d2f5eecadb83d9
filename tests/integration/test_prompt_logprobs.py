"""The static engine's prompt logprobs (batcher/static/prompt_logprobs.py) on the real model, fp32:
the numbers are those of the model's full logits, and computing them costs memory in proportion to
the rows that ask, not to rows x positions x vocabulary. Memory is counted by torch's CPU
allocator as the profiler reports it (every tensor's bytes, allocated and freed, in order), so
the bound is deterministic: no resident-memory sampling, no timing."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from batcher.sampling import SamplingParams
from batcher.sequence import Sequence

MiB = 1 << 20
# One piece of positions' logits and their log-softmax, with room to spare; a round's whole
# logits ([4, 500, 49,152] fp32) are 375 MiB, and their log-softmax and rank count more again.
EXTRA_BOUND = 32 * MiB
TOLERANCE = 1e-4  # fp32, the same batch: the lm_head over a few positions or all of them

WORDS = (
    "the river ran past the mill where an old baker counted loaves each morning before the bells "
    "of a quiet town rang seven times and children hurried along narrow lanes toward school while "
    "merchants opened shutters and swept dust from worn stone steps into the street "
).split()


def prompt_ids(runner, tokens: int, offset: int) -> list[int]:
    """A prose prompt of exactly `tokens` token ids (480 words or so make 500 of them)."""
    text = " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(tokens))
    return runner.tokenizer(text)["input_ids"][:tokens]


def round_rows(long: list[int], short: list[int], asking: bool) -> list[Sequence]:
    """Two copies of the long prompt at different k (a request's `n` copies share one computation),
    another prompt, and a row that does not ask."""

    def params(k):
        return SamplingParams(max_tokens=1, prompt_logprobs=k if asking else None)

    return [
        Sequence(long, params(5)),
        Sequence(long, params(3)),
        Sequence(short, params(2)),
        Sequence([1, 2, 3], params(None)),
    ]


def peak_extra_bytes(run) -> int:
    """The most bytes torch's CPU allocator held at once while `run()` ran, beyond what it held
    when it began: the running sum of the profiler's allocation records, in their order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    # the raw records (bytes: + allocated, - freed); prof.events() would file most of them under
    # the op that made them, and a running sum needs them in time order
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    records = sorted(
        (e for e in records if e.device_type() == torch.autograd.DeviceType.CPU), key=lambda e: e.start_ns()
    )
    assert sum(e.nbytes() for e in records if e.nbytes() > 0) > 0, (
        "no allocation recorded: the count would prove nothing"
    )
    live = peak = 0
    for record in records:
        live += record.nbytes()
        peak = max(peak, live)
    return peak


def test_prompt_logprobs_are_the_full_logits_numbers_in_bounded_memory(runner_fp32):
    runner = runner_fp32
    long, short = prompt_ids(runner, 500, 0), prompt_ids(runner, 150, 7)
    plain, asking = round_rows(long, short, asking=False), round_rows(long, short, asking=True)
    inputs = runner.encode([s.prompt for s in asking])
    plain_peak = peak_extra_bytes(lambda: runner.generate(plain, runner.encode([s.prompt for s in plain])))
    asking_peak = peak_extra_bytes(lambda: runner.generate(asking, inputs))
    # the round's own prefill is the same either way; what prompt logprobs add is one piece at a time
    assert asking_peak - plain_peak < EXTRA_BOUND, (asking_peak / MiB, plain_peak / MiB)
    assert asking[3].prompt_logprobs is None and all(s.prompt_logprobs is None for s in plain)

    # against the model's full logits over the same padded batch, as the prefill would give them
    with torch.inference_mode():
        full = runner.model(**inputs, logits_to_keep=0).logits  # [B, S, V]
    width = inputs["input_ids"].shape[1]
    for row, seq in enumerate(asking[:3]):
        ids, k = seq.prompt, seq.params.prompt_logprobs
        # position p predicts token p + 1; the first token has nothing before it
        logprobs = full[row, width - len(ids) : -1].float().log_softmax(dim=-1)  # [L - 1, V]
        chosen = logprobs.gather(1, torch.tensor(ids[1:])[:, None])
        ranks = (logprobs >= chosen).sum(dim=-1).tolist()
        top_values, top_ids = logprobs.topk(k, dim=-1)
        records = seq.prompt_logprobs
        assert [r.token_id for r in records] == ids and records[0].logprob is None and records[0].top == ()
        assert [r.logprob for r in records[1:]] == pytest.approx(chosen[:, 0].tolist(), abs=TOLERANCE)
        assert [r.rank for r in records[1:]] == ranks
        assert [[t for t, _, _ in r.top] for r in records[1:]] == top_ids.tolist()
        mine = [lp for r in records[1:] for _, _, lp in r.top]
        assert mine == pytest.approx(top_values.flatten().tolist(), abs=TOLERANCE)
        assert [r.token for r in records] == runner.tokenizer.batch_decode([[t] for t in ids])
        assert all(text == runner.tokenizer.decode([t]) for r in records[1:] for t, text, _ in r.top)
