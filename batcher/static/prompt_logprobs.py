"""The prompt's own logprobs on the static engine (vLLM's `prompt_logprobs`, and what `echo` with
`logprobs` returns), read off the round's prefill: the forward pass that generate() runs anyway
over every prompt position, so no row pays for a second pass.

generate() asks the model for the last position's logits only (`logits_to_keep=1`). A round in
which some row wants its prompt's logprobs asks the prefill for every position's instead (a
forward pre-hook sets `logits_to_keep=0`), and a forward hook turns them into each asking row's
records, at its real (non-pad) positions. Both hooks go at that first call, so the decode steps
run, and compile, as in any other round; the prefill is eager on the compiled path too
(transformers compiles the decode step only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from batcher.sequence import Sequence
from batcher.static.isolation import RowFailures
from batcher.tokens import TokenLogprob


class PromptLogprobs:
    def __init__(self, seqs: list[Sequence], inputs: dict[str, torch.Tensor], tokenizer, failures: RowFailures):
        self.seqs = seqs
        self.failures = failures  # a row's records are its own work: a failure there is the row's
        self.rows = [i for i, s in enumerate(seqs) if s.params.prompt_logprobs is not None]
        self.input_ids = inputs["input_ids"]  # [B, S], left-padded
        self.lengths = inputs["attention_mask"].sum(dim=-1).tolist()  # [B]
        self.tokenizer = tokenizer
        self._hooks: list = []

    @contextlib.contextmanager
    def hooked(self, model: torch.nn.Module) -> Iterator[None]:
        """Around the round's generate(): the first forward call records the prompts' logprobs."""
        if self.rows:
            self._hooks = [
                model.register_forward_pre_hook(self._every_position, with_kwargs=True),
                model.register_forward_hook(self._record, with_kwargs=True),
            ]
        try:
            yield
        finally:
            self._unhook()

    def _unhook(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @staticmethod
    def _every_position(module, args, kwargs):
        if "logits_to_keep" in kwargs:  # a model without it returns every position's logits anyway
            kwargs["logits_to_keep"] = 0
        return args, kwargs

    def _record(self, module, args, kwargs, output) -> None:
        self._unhook()  # the prefill only
        logits = output.logits  # [B, S, V]
        width = logits.shape[1]
        for row in self.rows:
            seq, length = self.seqs[row], self.lengths[row]
            start = width - length  # left padding before it
            ids = self.input_ids[row, start:]  # [L]
            with self.failures.guard(row, "prompt logprobs"):
                # position p predicts token p + 1; the first token has nothing before it
                logprobs = logits[row, start:-1].float().log_softmax(dim=-1)  # [L - 1, V]
                seq.prompt_logprobs = self._records(ids, logprobs, seq.params.prompt_logprobs)

    def _records(self, ids: torch.Tensor, logprobs: torch.Tensor, k: int) -> list[TokenLogprob]:
        chosen = logprobs.gather(1, ids[1:, None])  # [L - 1, 1]
        # vLLM's rank: how many tokens are at least as likely (1: the most likely)
        ranks = (logprobs >= chosen).sum(dim=-1).tolist()
        top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())
        ids_list = ids.tolist()
        texts = self._texts(ids_list + top_ids.flatten().tolist())
        prompt_texts, top_texts = texts[: len(ids_list)], texts[len(ids_list) :]
        records = [TokenLogprob(ids_list[0], prompt_texts[0], None)]
        for p, (token, logprob, rank) in enumerate(zip(ids_list[1:], chosen[:, 0].tolist(), ranks, strict=True)):
            alternatives = zip(top_ids[p].tolist(), top_texts[p * k : (p + 1) * k], top_values[p].tolist(), strict=True)
            records.append(TokenLogprob(token, prompt_texts[p + 1], logprob, tuple(alternatives), rank))
        return records

    def _texts(self, ids: list[int]) -> list[str]:
        return self.tokenizer.batch_decode([[t] for t in ids])
