"""RoundRows: the per-row bookkeeping of one static round, as `generate()`'s streamer and
stopping criteria. It ends each row at its own EOS, stop token, stop string or max_tokens, hands
each row's tokens, logprob records and text to its `Sequence` (which streams them), and never
hands out a possible start of a stop string. An EOS or stop token that ends a row is one of its
tokens (counted, with its record) but adds no text, as on vLLM. The worker finishes each sequence with its reason."""

from __future__ import annotations

import torch

from batcher.sequence import Sequence
from batcher.static.isolation import RowFailures
from batcher.static.processors import RecordLogprobs
from batcher.static.stops import find_stop, held_back


class RoundRows:
    """The round's `generate()` (batcher/static/decode.py) calls `put()` with each step's new
    tokens and then asks `__call__` which rows are done; a done row only gets padding afterwards.
    A row whose own work raised (`failures`) is done at once, with reason "failed"; the worker
    fails its sequence with the error."""

    def __init__(
        self,
        seqs: list[Sequence],
        tokenizer,
        eos_ids: set[int],
        logprobs: RecordLogprobs | None = None,
        failures: RowFailures | None = None,
    ):
        self.seqs = seqs
        self.failures = failures if failures is not None else RowFailures()
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.logprobs = logprobs
        self.reasons: list[str | None] = [None] * len(seqs)
        self.texts: list[str | None] = [None] * len(seqs)  # decoded so far (rows with stop strings)
        self.stop_from: list[int] = [0] * len(seqs)  # stop strings must end after this offset
        self.by_token: list[bool] = [False] * len(seqs)  # ended by EOS or a stop token (its last)

    def put(self, value: torch.Tensor) -> None:
        tokens = value.tolist()  # [B], this step's tokens
        records = self.logprobs.take(tokens) if self.logprobs is not None else {}
        for row, token in enumerate(tokens):
            if self.reasons[row] is None and row not in self.failures:
                with self.failures.guard(row, "stop strings and text"):
                    self._step(row, token, records)
            if row in self.failures:
                self.reasons[row] = "failed"

    def _step(self, row: int, token: int, records: dict) -> None:
        seq = self.seqs[row]
        seq.add_tokens([token], [records[row]] if row in records else ())
        if token in self.eos_ids or token in seq.params.stop_token_ids:
            # generated and counted, with its logprob record, but no text: as vLLM does, so
            # that a harness reading the last record as the generated token finds it there
            self.reasons[row], self.by_token[row] = "stop", True
            return
        if seq.stream or seq.params.stop:
            self._advance(row)
        if self.reasons[row] is None and len(seq.token_ids) >= seq.params.max_tokens:
            self.reasons[row] = "length"

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.BoolTensor:
        for row, seq in enumerate(self.seqs):
            if row in self.failures:  # its grammar or logprobs failed in this step's processors
                self.reasons[row] = "failed"
            elif self.reasons[row] is None and seq.cancelled:
                self.reasons[row] = "cancelled"
        return torch.tensor([r is not None for r in self.reasons], device=input_ids.device)

    def _advance(self, row: int) -> None:
        # Decode the whole row: merged tokens keep their spaces, and a stop string split across
        # tokens is seen whole. Re-decoding is O(n^2) in tokens, negligible at a few hundred.
        seq, stops = self.seqs[row], self.seqs[row].params.stop
        text = self.tokenizer.decode(seq.token_ids, skip_special_tokens=True)
        searched = len(self.texts[row] or "")
        self.texts[row] = text
        if len(seq.token_ids) <= seq.params.min_tokens:
            self.stop_from[row] = len(text)  # vLLM: a stop string must end after min_tokens
        elif stops:
            cut = find_stop(text, stops, max(searched, self.stop_from[row]))
            if cut is not None:
                self.texts[row], self.reasons[row] = text[:cut], "stop"
                return  # finish() hands over what is left before the stop string
        # Hold back a trailing U+FFFD (a multi-byte character split across tokens comes out
        # whole) and any tail that may be the start of a stop string. `seq.text` is what the
        # row handed over so far.
        if seq.stream and not text.endswith("\ufffd"):
            safe = max(len(text) - held_back(text, stops), len(seq.text))
            seq.add_text(text[len(seq.text) : safe])

    def finish(self, row: int) -> str:
        """Hand the row's sequence the rest of its text (what was held back, or all of it when it
        was not streamed); returns the row's finish reason ("failed": see `failures`)."""
        with self.failures.guard(row, "text"):
            if row not in self.failures:
                self._hand_over(row)
        return "failed" if row in self.failures else self.reasons[row] or "length"

    def _hand_over(self, row: int) -> None:
        seq = self.seqs[row]
        text = self.texts[row]
        if text is None or self.reasons[row] != "stop":  # decoded whole, without held-back bytes
            ids = seq.token_ids[:-1] if self.by_token[row] else seq.token_ids  # a stop token has no text
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        seq.add_text(text[len(seq.text) :])
