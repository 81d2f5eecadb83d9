"""Per-row logits processors for one static round, in vLLM's order, so a round of rows that all
differ stays one `generate()` call:

    grammar mask -> record logprobs (the model's scores, masked) -> ignore_eos -> min_tokens -> logit_bias -> penalties
    -> greedy argmax | temperature -> min_p -> top_k -> top_p -> seeded draw

`build()` adds a processor only when some row of the round needs it: a plain greedy round gets
none and costs what it cost before. Each processor is neutral on the rows that did not ask.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from batcher.sequence import Sequence
from batcher.static.constraint import GrammarMask
from batcher.static.isolation import RowFailures
from batcher.tokens import TokenLogprob


def _column(values, device, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, device=device, dtype=dtype)[:, None]  # [B, 1]


class RecordLogprobs(LogitsProcessor):
    """First in the list, so it sees the model's own distribution (vLLM's default
    `logprobs_mode="raw_logprobs"`). Keeps the step's log-softmax of the rows that asked;
    `take()` reads off the chosen tokens once `generate()` has picked them."""

    def __init__(self, seqs: list[Sequence], tokenizer, failures: RowFailures):
        self.failures = failures
        self.rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        self.ks = [seqs[i].params.logprobs for i in self.rows]
        self.tokenizer = tokenizer
        self.last: torch.Tensor | None = None  # [R, V]
        self.top: tuple[list[list[float]], list[list[int]]] = ([], [])

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # scores: [B, V]
        self.last = scores[self.rows].float().log_softmax(dim=-1)
        k = max(self.ks)
        if k:
            values, ids = self.last.topk(k, dim=-1)  # sorted, most likely first
            self.top = (values.tolist(), ids.tolist())
        return scores

    def take(self, tokens: list[int]) -> dict[int, TokenLogprob]:
        """{row: the chosen token's record} for this step's tokens (one per row of the round)."""
        chosen = torch.tensor([tokens[r] for r in self.rows], device=self.last.device)
        logprobs = self.last.gather(1, chosen[:, None])[:, 0].tolist()
        text = self.tokenizer.decode
        records = {}
        for i, row in enumerate(self.rows):
            with self.failures.guard(row, "logprobs"):  # decoding is the row's own work
                top = ()
                if self.ks[i]:
                    pairs = zip(self.top[1][i][: self.ks[i]], self.top[0][i][: self.ks[i]], strict=True)
                    top = tuple((tid, text([tid]), lp) for tid, lp in pairs)
                records[row] = TokenLogprob(tokens[row], text([tokens[row]]), logprobs[i], top)
        return records


class SuppressEos(LogitsProcessor):
    """Rows that ignore EOS never pick it: HF's own `min_new_tokens` does the same, for all rows."""

    def __init__(self, rows: torch.Tensor, eos_ids: list[int]):
        self.rows = rows  # [B] bool
        self.eos_ids = eos_ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # scores: [B, V]
        is_eos = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
        is_eos[self.eos_ids] = True
        return scores.masked_fill(self.rows[:, None] & is_eos[None, :], float("-inf"))


class MinTokens(LogitsProcessor):
    """Until a row has min_tokens, its stop tokens (EOS and its stop_token_ids) are banned."""

    def __init__(self, seqs: list[Sequence], eos_ids: list[int], prompt_len: int, vocab: int, device):
        self.prompt_len = prompt_len
        self.min_tokens = _column([s.params.min_tokens for s in seqs], device, torch.long)  # [B, 1]
        self.banned = torch.zeros(len(seqs), vocab, dtype=torch.bool, device=device)  # [B, V]
        for row, seq in enumerate(seqs):
            if seq.params.min_tokens:
                self.banned[row, list(eos_ids) + list(seq.params.stop_token_ids)] = True

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_len
        return scores.masked_fill(self.banned & (generated < self.min_tokens), float("-inf"))


class LogitBias(LogitsProcessor):
    def __init__(self, seqs: list[Sequence], vocab: int, device):
        self.bias = torch.zeros(len(seqs), vocab, device=device)  # [B, V]
        for row, seq in enumerate(seqs):
            for token, bias in seq.params.logit_bias:
                self.bias[row, token] = bias

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores + self.bias


class Penalties(LogitsProcessor):
    """vLLM's (and OpenAI's) definitions: repetition divides positive / multiplies negative
    scores of tokens seen in the prompt or the output; frequency subtracts per output
    occurrence; presence subtracts once per token present in the output."""

    def __init__(self, seqs: list[Sequence], attention_mask: torch.Tensor):
        device = attention_mask.device
        self.prompt_mask = attention_mask  # [B, S], 0 on left padding
        self.prompt_len = attention_mask.shape[1]
        self.repetition = _column([s.params.repetition_penalty for s in seqs], device)
        self.frequency = _column([s.params.frequency_penalty for s in seqs], device)
        self.presence = _column([s.params.presence_penalty for s in seqs], device)
        self.in_prompt: torch.Tensor | None = None  # [B, V], built at the first step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.in_prompt is None:
            prompt = input_ids[:, : self.prompt_len]
            counts = torch.zeros_like(scores).scatter_add_(1, prompt, self.prompt_mask.to(scores.dtype))
            self.in_prompt = counts > 0
        output = input_ids[:, self.prompt_len :]
        counts = torch.zeros_like(scores).scatter_add_(1, output, torch.ones_like(output, dtype=scores.dtype))
        in_output = counts > 0
        penalty = torch.where(self.in_prompt | in_output, self.repetition, 1.0)
        scores = torch.where(scores > 0, scores / penalty, scores * penalty)
        return scores - self.frequency * counts - self.presence * in_output


class PerRowSampling(LogitsProcessor):
    """Temperature, min_p, top_k and top_p per row; greedy rows keep only their argmax, and
    seeded rows draw their token with their own `torch.Generator` and keep only it, so one
    `generate()` call serves greedy, seeded and unseeded rows side by side."""

    def __init__(self, seqs: list[Sequence], device):
        self.temperature = _column([s.params.temperature for s in seqs], device)
        self.min_p = _column([s.params.min_p for s in seqs], device)
        self.top_p = _column([s.params.top_p for s in seqs], device)
        self.top_k = [s.params.top_k if s.params.top_k > 0 else None for s in seqs]
        self.generators = {
            row: torch.Generator(device).manual_seed(s.params.seed)
            for row, s in enumerate(seqs)
            if s.params.seed is not None and not s.params.greedy
        }

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # scores: [B, V]. A penalty near 0 (repetition_penalty 5e-324 is > 0, so valid) divides
        # scores to +inf, whose softmax is NaN: the largest finite score instead, as likely as
        # each other such token (found by tests/e2e/test_fuzz.py's kind of request; vLLM answers it)
        scaled = (scores / self.temperature.clamp(min=1e-5)).nan_to_num(posinf=torch.finfo(scores.dtype).max)
        if bool((self.min_p > 0).any()):
            probs = scaled.softmax(dim=-1)
            scaled = scaled.masked_fill(probs < self.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
        if any(self.top_k):
            vocab = scores.shape[-1]  # a k past the vocabulary keeps every token, as on vLLM
            k = torch.tensor([min(k or vocab, vocab) for k in self.top_k], device=scores.device)
            kth = scaled.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        sampled = scaled
        if bool((self.top_p < 1).any()):  # as vLLM: no sort of the vocabulary unless a row asked
            sorted_logits, order = scaled.sort(dim=-1)  # ascending
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            drop_sorted = cumulative <= 1 - self.top_p
            drop_sorted[:, -1] = False  # always keep the most likely token
            drop = drop_sorted.scatter(1, order, drop_sorted)
            sampled = scaled.masked_fill(drop, float("-inf"))
        for row, generator in self.generators.items():
            token = torch.multinomial(sampled[row].softmax(dim=-1), 1, generator=generator)
            sampled[row] = _one_hot(sampled[row], token)
        return torch.where(self.temperature == 0, _one_hot(scores, scores.argmax(dim=-1, keepdim=True)), sampled)


def _one_hot(scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.full_like(scores, float("-inf")).scatter(-1, index, 0.0)


def build(
    seqs: list[Sequence],
    tokenizer,
    eos_ids: list[int],
    attention_mask: torch.Tensor,
    vocab: int,
    failures: RowFailures,
) -> tuple[LogitsProcessorList, RecordLogprobs | None, bool]:
    """(the round's processors, the logprobs recorder if any row asked, whether generate() must
    sample: only for sampled rows without a seed; every other row arrives one-hot). What a
    processor does for one row alone (a grammar, a logprob record) fails that row in `failures`."""
    device = attention_mask.device
    params = [s.params for s in seqs]
    processors = LogitsProcessorList()
    recorder = None
    if any(p.structured is not None for p in params):  # first: everything after sees the masked scores
        processors.append(GrammarMask(seqs, eos_ids, attention_mask.shape[1], vocab, failures))
    if any(p.logprobs is not None for p in params):
        recorder = RecordLogprobs(seqs, tokenizer, failures)
        processors.append(recorder)
    if any(p.ignore_eos for p in params):
        processors.append(SuppressEos(torch.tensor([p.ignore_eos for p in params], device=device), eos_ids))
    if any(p.min_tokens for p in params):
        processors.append(MinTokens(seqs, eos_ids, attention_mask.shape[1], vocab, device))
    if any(p.logit_bias for p in params):
        processors.append(LogitBias(seqs, vocab, device))
    if any(p.penalized for p in params):
        processors.append(Penalties(seqs, attention_mask))
    if any(not p.greedy for p in params):
        processors.append(PerRowSampling(seqs, device))
    return processors, recorder, any(not p.greedy and p.seed is None for p in params)
