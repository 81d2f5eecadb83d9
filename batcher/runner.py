"""The model itself: tokenize with left padding, one `generate()` per round, decode per row.

Everything per row (max_tokens, temperature, top_p, cancellation, streaming) rides on hooks that
`transformers.generate()` already offers, so a round stays one `generate()` call:
- `LogitsProcessor`s apply each row's temperature and top_p (greedy rows become one-hot) and
  keep EOS away from rows that ignore it,
- a `StoppingCriteria` ends each row at its own max_tokens, at EOS, or when it is cancelled,
- a streamer receives each decoding step's tokens, so streamed text leaves as it is produced.
"""

from __future__ import annotations

import logging
import os

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

from batcher.sequence import Sequence

log = logging.getLogger(__name__)

# vLLM's CPU worker replaces torch.set_num_threads with a no-op once its engine starts (it binds
# its own OpenMP threads); keep the real one so the static model thread can still size its own.
_set_num_threads = torch.set_num_threads


def set_torch_threads(n: int) -> None:
    """Intra-op threads for ops run by the calling thread; 0: every core this thread may use."""
    _set_num_threads(n or len(os.sched_getaffinity(0)))


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    """bf16 where the hardware computes it natively, else fp16 on a GPU, fp32 on a CPU."""
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    native_bf16 = torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16") and (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )
    return torch.bfloat16 if native_bf16 else torch.float32


class PerRowSampling(LogitsProcessor):
    """Temperature and top-p per row; rows with temperature 0 keep only their argmax, so one
    `do_sample=True` call serves greedy and sampled rows side by side."""

    def __init__(self, temperature: torch.Tensor, top_p: torch.Tensor):
        self.temperature = temperature  # [B]
        self.top_p = top_p  # [B]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # scores: [B, V]
        greedy = (self.temperature == 0)[:, None]
        scaled = scores / self.temperature.clamp(min=1e-5)[:, None]
        sorted_logits, order = scaled.sort(dim=-1)  # ascending
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - self.top_p)[:, None]
        drop_sorted[:, -1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(1, order, drop_sorted)
        sampled = scaled.masked_fill(drop, float("-inf"))
        one_hot = torch.full_like(scores, float("-inf")).scatter(1, scores.argmax(-1, keepdim=True), 0.0)
        return torch.where(greedy, one_hot, sampled)


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


class RoundRows(BaseStreamer, StoppingCriteria):
    """Per-row bookkeeping of one round. `generate()` calls `put()` with each step's new tokens
    and then asks `__call__` which rows are done; a done row only gets padding afterwards."""

    def __init__(self, seqs: list[Sequence], tokenizer, eos_ids: set[int]):
        self.seqs = seqs
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.reasons: list[str | None] = [None] * len(seqs)
        self.sent: list[str] = [""] * len(seqs)  # text already streamed, per row

    def put(self, value: torch.Tensor) -> None:
        if value.dim() > 1:  # generate() first hands the streamer the prompts: [B, S]
            return
        for row, token in enumerate(value.tolist()):  # value: [B], this step's tokens
            if self.reasons[row] is not None:
                continue
            seq = self.seqs[row]
            if token in self.eos_ids:
                self.reasons[row] = "stop"
                continue
            seq.token_ids.append(token)
            if seq.stream:
                self._stream(row)
            if len(seq.token_ids) >= seq.params.max_tokens:
                self.reasons[row] = "length"

    def end(self) -> None:
        pass

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.BoolTensor:
        for row, seq in enumerate(self.seqs):
            if self.reasons[row] is None and seq.cancelled:
                self.reasons[row] = "cancelled"
        return torch.tensor([r is not None for r in self.reasons], device=input_ids.device)

    def _stream(self, row: int) -> None:
        # Decode the whole row and send what is new, holding back a trailing U+FFFD: a multi-byte
        # character split across tokens comes out whole, and merged tokens keep their spaces.
        # Re-decoding is O(n^2) in tokens, negligible at completion lengths of a few hundred.
        text = self.tokenizer.decode(self.seqs[row].token_ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.seqs[row].emit(text[len(self.sent[row]) :])
        self.sent[row] = text

    def finish(self, row: int) -> tuple[str, str]:
        """The row's final text and finish reason; streams whatever was held back."""
        seq = self.seqs[row]
        text = self.tokenizer.decode(seq.token_ids, skip_special_tokens=True)
        if seq.stream:
            seq.emit(text[len(self.sent[row]) :])
        return text, self.reasons[row] or "length"


class Runner:
    """A causal LM and its tokenizer, ready to run rounds. Not thread-safe: one model thread."""

    def __init__(self, model_path: str, *, dtype: str = "auto", device: str = "auto", max_input_tokens: int = 512):
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.max_input_tokens = max_input_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        # Decoder-only models continue from the last position, so padding must go on the left;
        # an over-long prompt keeps its end, which is what the completion continues from.
        self.tokenizer.padding_side = "left"
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype).to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        log.info("loaded %s on %s as %s", model_path, self.device, self.dtype)

    def encode(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask: [B, S], left-padded to the longest prompt."""
        return self.tokenizer(
            prompts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_input_tokens
        ).to(self.device)

    @torch.inference_mode()
    def generate(self, seqs: list[Sequence], inputs: dict[str, torch.Tensor]) -> dict[str, tuple[str, str]]:
        """Run one round; return {sequence id: (completion text, finish reason)}."""
        rows = RoundRows(seqs, self.tokenizer, self.eos_ids)
        for seq, count in zip(seqs, inputs["attention_mask"].sum(dim=-1).tolist(), strict=True):
            seq.prompt_tokens = count  # the prompt as this round saw it: padding off, truncation on
        sample = any(not s.params.greedy for s in seqs)
        processors = LogitsProcessorList()
        if any(s.params.ignore_eos for s in seqs):
            ignore_eos = torch.tensor([s.params.ignore_eos for s in seqs], device=self.device)
            processors.append(SuppressEos(ignore_eos, sorted(self.eos_ids)))
        if sample:
            processors.append(
                PerRowSampling(
                    torch.tensor([s.params.temperature for s in seqs], device=self.device),
                    torch.tensor([s.params.top_p for s in seqs], device=self.device),
                )
            )
        config = GenerationConfig(
            max_new_tokens=max(s.params.max_tokens for s in seqs),
            do_sample=sample,
            temperature=1.0,  # per-row temperature and top_p are PerRowSampling's job
            top_k=0,
            top_p=1.0,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=sorted(self.eos_ids),
        )
        self.model.generate(
            **inputs,
            generation_config=config,
            logits_processor=processors,
            stopping_criteria=StoppingCriteriaList([rows]),
            streamer=rows,
        )
        return {seq.id: rows.finish(row) for row, seq in enumerate(seqs)}
