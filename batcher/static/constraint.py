"""GrammarMask: the per-row structured-output constraint of one static round, first of the round's
logits processors (vLLM masks before it computes logprobs, penalties or samples; so do we).

Written on xgrammar's matcher and bitmask API rather than taken whole: xgrammar's ready-made
Hugging Face processor holds one grammar for every row, and a round mixes rows with different
grammars and rows with none. Each constrained row owns a `GrammarMatcher`; at each step it
accepts the row's last token and fills the row's bitmask; rows without a spec are untouched.

A matcher's stop tokens are the round's EOS ids, so a row whose grammar is complete can only
pick EOS, and RoundRows ends it there with finish_reason "stop", as any EOS.
"""

from __future__ import annotations

import logging

import torch
from transformers import LogitsProcessor

from batcher.sequence import Sequence
from batcher.static.isolation import RowFailures

log = logging.getLogger(__name__)


class GrammarMask(LogitsProcessor):
    def __init__(self, seqs: list[Sequence], eos_ids: list[int], prompt_len: int, vocab: int, failures: RowFailures):
        import xgrammar as xgr

        self._xgr = xgr
        self.prompt_len = prompt_len
        self.vocab = vocab
        self.failures = failures  # a row whose matcher raises fails alone, and leaves the mask
        self.matchers = {}  # row -> its matcher, while the row is still under its grammar
        for row, seq in enumerate(seqs):
            if seq.params.structured is not None:
                with failures.guard(row, "grammar"):
                    compiled = seq.params.structured.compiled
                    if compiled is None:  # the service compiles a spec as it enqueues it: a bug
                        raise ValueError("the row's grammar reached the engine uncompiled")
                    self.matchers[row] = xgr.GrammarMatcher(compiled, override_stop_tokens=eos_ids)
        self.bitmask = xgr.allocate_token_bitmask(len(seqs), vocab)  # [B, ceil(V / 32)] int32, CPU

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # input_ids: [B, S + generated so far]; scores: [B, V]
        if input_ids.shape[1] > self.prompt_len:
            self._accept(input_ids[:, -1].tolist())
        if not self.matchers:
            return scores
        for row in sorted(self.matchers):
            with self.failures.guard(row, "grammar"):
                self.matchers[row].fill_next_token_bitmask(self.bitmask, row)
        self._drop_failed()
        if not self.matchers:
            return scores
        rows = sorted(self.matchers)
        bitmask = self.bitmask.to(scores.device, non_blocking=True)
        self._xgr.apply_token_bitmask_inplace(scores, bitmask, vocab_size=self.vocab, indices=rows)
        return scores

    def _accept(self, tokens: list[int]) -> None:
        """The last step's tokens. A row leaves the mask when its grammar ended (it took a stop
        token, so RoundRows ends it) or its token was not the grammar's: the row ended for
        another reason (max_tokens, a stop string, cancelled) and generate() feeds it padding."""
        for row in list(self.matchers):
            matcher = self.matchers[row]
            with self.failures.guard(row, "grammar"):
                if not matcher.accept_token(tokens[row]) or matcher.is_terminated():
                    del self.matchers[row]
        self._drop_failed()

    def _drop_failed(self) -> None:
        for row in [r for r in self.matchers if r in self.failures]:
            del self.matchers[row]
