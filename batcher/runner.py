"""The model itself: tokenize with left padding, one `generate()` per round, decode per row.

Everything per row (max_tokens, sampling, penalties, stop, logprobs, cancellation, streaming)
rides on hooks that `transformers.generate()` already offers, so a round stays one call:
- `LogitsProcessor`s (batcher/processors.py) apply each row's own parameters in vLLM's order
  (greedy and seeded rows become one-hot) and record logprobs,
- a `StoppingCriteria` (batcher/rows.py) ends each row at its own max_tokens, EOS, stop token or
  stop string, or when it is cancelled,
- the same object is the streamer: it receives each step's tokens, so text leaves as produced.
"""

from __future__ import annotations

import logging
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, StoppingCriteriaList

from batcher import processors as per_row
from batcher.rows import RoundRows
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
        processors, recorder, sample = per_row.build(
            seqs, self.tokenizer, sorted(self.eos_ids), inputs["attention_mask"], self.model.config.vocab_size
        )
        rows = RoundRows(seqs, self.tokenizer, self.eos_ids, recorder)
        for seq, count in zip(seqs, inputs["attention_mask"].sum(dim=-1).tolist(), strict=True):
            seq.prompt_tokens = count  # the prompt as this round saw it: padding off, truncation on
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
