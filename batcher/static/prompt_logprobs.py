"""The prompt's own logprobs on the static engine (vLLM's `prompt_logprobs`, and what `echo` with
`logprobs` returns), read off the round's prefill: the forward pass that generate() runs anyway
over every prompt position, so no row pays for a second pass through the layers.

generate() asks the model for the last position's logits only (`logits_to_keep=1`), and so it
stays: every position's logits of every row at once would be rows x positions x vocabulary
floats (4 x 512 x 49,152 is 384 MiB), held at once and kept by the allocator afterwards. Instead
a forward hook on the model's body keeps the prefill's final hidden states ([B, S, H], small),
and a forward hook on the model turns them into each asking row's records: the model's own
output embedding (its lm_head, whatever linear it is) over a few positions at a time, each
piece's log-softmax read off (the chosen token's logprob and rank, the top k) and dropped before
the next. Rows with the same prompt (a request's `n` copies) share one computation. So the extra
memory is one piece's logits, whatever the round, and the work is the asking rows' own positions.
Both hooks go at that first call, so the decode steps run, and compile, as in any other round;
the prefill is eager on the compiled path too (the round compiles the decode step only).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from collections.abc import Iterator

import torch

from batcher.sequence import Sequence
from batcher.static.isolation import RowFailures
from batcher.tokens import TokenLogprob

# glibc's malloc_trim, where this process has it (None elsewhere): see `hooked`
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
PIECE_BYTES = 8 << 20  # fp32 logits of one piece of positions; its log-softmax and rank count take as much again


class PromptLogprobs:
    def __init__(self, seqs: list[Sequence], inputs: dict[str, torch.Tensor], tokenizer, failures: RowFailures):
        self.seqs = seqs
        self.failures = failures  # a row's records are its own work: a failure there is the row's
        self.rows = [i for i, s in enumerate(seqs) if s.params.prompt_logprobs is not None]
        self.input_ids = inputs["input_ids"]  # [B, S], left-padded
        self.lengths = inputs["attention_mask"].sum(dim=-1).tolist()  # [B]
        self.tokenizer = tokenizer
        self.hidden: torch.Tensor | None = None  # [B, S, H]: the prefill's final hidden states
        self.head: torch.nn.Module | None = None  # the model's output embedding (lm_head)
        self._hooks: list = []

    @contextlib.contextmanager
    def hooked(self, model: torch.nn.Module) -> Iterator[None]:
        """Around the round's generate(): the first forward call records the prompts' logprobs."""
        if self.rows:
            self.head = model.get_output_embeddings()
            self._hooks = [
                model.base_model.register_forward_hook(self._keep_hidden),
                model.register_forward_hook(self._record),
            ]
        try:
            yield
        finally:
            self._unhook()
            self.hidden = None
            if self.rows and _malloc_trim is not None:
                # Under plain glibc (gunicorn without make serve's tcmalloc preload) the freed pieces
                # and the long prefill around them stay in the model thread's malloc arena, and the
                # worker's resident memory with them; one trim per such round gives them back, for
                # a few milliseconds. Under tcmalloc the pieces reuse pages it already holds, and
                # this trims glibc's near-empty arenas only (docs/performance.md).
                _malloc_trim(0)

    def _unhook(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _keep_hidden(self, module, args, output) -> None:
        self.hidden = output[0]  # last_hidden_state, after the final norm: what the lm_head reads

    def _record(self, module, args, output) -> None:
        self._unhook()  # the prefill only
        hidden, self.hidden = self.hidden, None
        width, self.vocab = hidden.shape[1], output.logits.shape[-1]
        wrong = self._wrong_head(hidden, output.logits)
        starts = {row: width - self.lengths[row] for row in self.rows}  # left padding before each
        prompts = {row: tuple(self.input_ids[row, start:].tolist()) for row, start in starts.items()}
        ks: dict[tuple[int, ...], set[int]] = {}  # each prompt's k's: copies share one computation
        for row, prompt in prompts.items():
            ks.setdefault(prompt, set()).add(self.seqs[row].params.prompt_logprobs)
        computed: dict[tuple[int, ...], dict[int, list[TokenLogprob]]] = {}
        for row, prompt in prompts.items():
            seq, start = self.seqs[row], starts[row]
            with self.failures.guard(row, "prompt logprobs"):
                if wrong:
                    raise RuntimeError(wrong)
                if prompt not in computed:
                    computed[prompt] = self._records(hidden[row, start:], self.input_ids[row, start:], ks[prompt])
                seq.prompt_logprobs = list(computed[prompt][seq.params.prompt_logprobs])  # records are frozen

    def _wrong_head(self, hidden: torch.Tensor, logits: torch.Tensor) -> str | None:
        """Why the records cannot be computed here, if they cannot. They take the logits to be the
        output embedding of the final hidden states, as in the models this engine runs; a model
        that transforms them after (a soft-cap, a scale) would get wrong numbers, so its asking
        rows fail instead. Checked on each asking row's last position, which the prefill computed
        anyway (logits: [B, 1, V])."""
        if self.head is None:
            return "this model has no output embedding to compute prompt logprobs with"
        mine = self.head(hidden[self.rows, -1]).float()  # [R, V]
        if not torch.allclose(mine, logits[self.rows, -1].float(), rtol=1e-2, atol=1e-1):
            return "this model's logits are not its output embedding's: no prompt logprobs from it"
        return None

    def _records(self, hidden: torch.Tensor, ids: torch.Tensor, ks: set[int]) -> dict[int, list[TokenLogprob]]:
        """One prompt's records at each k it is asked at: `hidden` [L, H] its final hidden states,
        `ids` [L] its tokens. A top k of its own per k, not a cut of the largest: tied logprobs
        (common in fp16) may come in another order."""
        chosen, ranks = [], []
        tops: dict[int, tuple[list, list]] = {k: ([], []) for k in ks if k}  # k: (values, ids) per position
        for lo, hi in _pieces(len(ids) - 1, max(1, PIECE_BYTES // (4 * self.vocab))):
            # position p predicts token p + 1; the first token has nothing before it
            logprobs = self.head(hidden[lo:hi]).float().log_softmax(dim=-1)  # [P, V]
            picked = logprobs.gather(1, ids[lo + 1 : hi + 1, None])  # [P, 1]
            chosen += picked[:, 0].tolist()
            # vLLM's rank: how many tokens are at least as likely (1: the most likely); counted in
            # int32, since a bool sum would widen the whole piece to int64 first
            ranks += (logprobs >= picked).sum(dim=-1, dtype=torch.int32).tolist()
            for k, (values, tokens) in tops.items():
                top_values, top_ids = logprobs.topk(k, dim=-1)  # sorted, most likely first
                values += top_values.tolist()
                tokens += top_ids.tolist()
            del logprobs  # before the next piece's: one piece's logits at a time
        ids_list = ids.tolist()
        seen = list(dict.fromkeys(ids_list + [t for _, tokens in tops.values() for top in tokens for t in top]))
        text = dict(zip(seen, self._texts(seen), strict=True))
        records = {}
        for k in ks:
            values, tokens = tops.get(k, ([], []))
            records[k] = [TokenLogprob(ids_list[0], text[ids_list[0]], None)]
            for p, (token, logprob, rank) in enumerate(zip(ids_list[1:], chosen, ranks, strict=True)):
                top = tuple((t, text[t], v) for t, v in zip(tokens[p], values[p], strict=True)) if k else ()
                records[k].append(TokenLogprob(token, text[token], logprob, top, rank))
        return records

    def _texts(self, ids: list[int]) -> list[str]:
        return self.tokenizer.batch_decode([[t] for t in ids])


def _pieces(count: int, most: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) ranges over `count` positions, at most `most` each, of nearly equal sizes (no
    short tail: a linear may take another path for a call of very few rows, see linear.py)."""
    if count <= 0:
        return
    pieces = math.ceil(count / most)
    size = math.ceil(count / pieces)
    for lo in range(0, count, size):
        yield lo, min(lo + size, count)
