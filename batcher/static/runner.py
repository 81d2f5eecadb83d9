"""The model itself: tokenize with left padding, one `generate()` per round (our own:
batcher/static/decode.py), decode per row.

Everything per row (max_tokens, sampling, penalties, stop, logprobs, cancellation, streaming)
rides on transformers' hook interfaces, so a round stays one call:
- `LogitsProcessor`s (batcher/static/processors.py) apply each row's own parameters in vLLM's order
  (greedy and seeded rows become one-hot) and record logprobs,
- a `StoppingCriteria` (batcher/static/rows.py) ends each row at its own max_tokens, EOS, stop token or
  stop string, or when it is cancelled,
- the same object is the streamer: it receives each step's tokens, so text leaves as produced.
Each row's tokens and text go straight into its `Sequence`; a round returns only the reasons.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from batcher.sampling import SamplingParams
from batcher.sequence import Prompt, Sequence
from batcher.settings import BLOCKS, StaticSettings
from batcher.static import decode, gguf_blocks, graphs
from batcher.static import processors as per_row
from batcher.static.isolation import RowFailures
from batcher.static.linear import half_weights, pack_linears, packs
from batcher.static.prefix import PrefixCache
from batcher.static.prompt_logprobs import PromptLogprobs
from batcher.static.rows import RoundRows
from batcher.static.shapes import Shape, cache_bucket, graph_width, pad_rows, static_cache

log = logging.getLogger(__name__)

# vLLM's CPU worker replaces torch.set_num_threads with a no-op once its engine starts (it binds
# its own OpenMP threads); keep the real one so the static model thread can still size its own.
_set_num_threads = torch.set_num_threads


def set_torch_threads(n: int) -> None:
    """Intra-op threads for ops run by the calling thread; 0: every core this thread may use."""
    _set_num_threads(n or len(os.sched_getaffinity(0)))


def compiled_step(device: str):
    """The decode step compiled whole (batcher/static/decode.py): static shapes (see Runner.generate
    for how few), so a static KV cache; CUDA graphs on a GPU, on a CPU graphs.OPTIONS around the
    round that compiles (Runner.generate), its weights the graph's inputs, as eager reads them (one
    copy: batcher/static/linear.py, blocks.py). The prefill stays eager."""
    mode = "reduce-overhead" if device.startswith("cuda") else "default"
    return torch.compile(decode.next_logits, fullgraph=True, dynamic=False, mode=mode)


class Runner:
    """A causal LM and its tokenizer, ready to run rounds. Not thread-safe: one model thread."""

    def __init__(self, settings: StaticSettings):
        self.settings = settings
        self.device = settings.device
        # "blocks": the GGUF's own blocks read by fp32 kernels (batcher/static/blocks.py); fp32 otherwise
        self.blocks = settings.dtype == BLOCKS
        self.dtype = torch.float32 if self.blocks else getattr(torch, settings.dtype)
        self.max_input_tokens = settings.max_input_tokens
        self.step = compiled_step(self.device) if settings.compile else None
        self.max_batch = settings.batch_size
        self.max_cache_len = settings.max_input_tokens + settings.max_tokens_limit
        model_path = settings.model_path
        # each (graph_width, cache length) ready: its step, compiled here (`step`) or loaded (graphs.py)
        self._graphs: dict[Shape, Callable] = {}
        # whether a round may make a graph not made yet (else it runs eager): the worker's gate
        self.may_compile: Callable[[Shape], bool] = lambda shape: True
        self.prefix = PrefixCache(settings.prefix_cache)
        if self.step is not None:  # a graph per width and cache length (cache_bucket), not more
            limit = 2 * cache_bucket(self.max_cache_len, self.max_cache_len).bit_length()
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        # Decoder-only models continue from the last position, so padding must go on the left.
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        on_cpu = self.device == "cpu"
        # fp16 where oneDNN cannot pack it: fp16 weights computed in fp32 (batcher/static/linear.py)
        half = on_cpu and self.dtype == torch.float16 and packs(torch.float16) is not None
        half = half and packs(torch.float32) is None
        loaded = torch.float32 if half else self.dtype
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=loaded).to(self.device).eval()
        linears = ""
        if self.blocks:  # before the packing below, which takes the linears left dense
            if self.device != "cpu":
                raise ValueError("the GGUF's blocks are read by CPU kernels: DEVICE=cpu")
            linears = gguf_blocks.use_blocks(self.model, model_path, settings.kernel_dir)
        if on_cpu:  # batcher/static/linear.py, compiled or not
            packed = (half_weights if half else pack_linears)(self.model, self.max_batch)
            linears = "; ".join(filter(None, [linears, packed]))
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        log.info(
            "loaded %s on %s as %s, decoding %s%s",
            model_path,
            self.device,
            self.dtype,
            "compiled (static cache)" if self.step else "eager",
            f", {linears}" if linears else "",
        )

    compiles = property(lambda self: self.step is not None)

    def use_graph(self, shape: Shape, step: Callable) -> None:
        """Decode the rounds of this shape through `step`, a graph built elsewhere (graphs.py)."""
        self._graphs[shape] = step

    def shape(self, inputs: dict[str, torch.Tensor], max_tokens: int) -> Shape | None:
        """The graph this round decodes through, or None: eager (not compiled, or a graph that
        `may_compile` does not let this round make: it runs eager meanwhile)."""
        if self.step is None:
            return None
        rows, length = inputs["input_ids"].shape
        shape = (graph_width(rows, self.max_batch), cache_bucket(length + max_tokens, self.max_cache_len))
        return shape if shape in self._graphs or self.may_compile(shape) else None

    def needs_compile(self, inputs: dict[str, torch.Tensor], max_tokens: int) -> bool:
        """Whether this round would make a new graph (a width and cache length not seen yet)."""
        shape = self.shape(inputs, max_tokens)
        return shape is not None and shape not in self._graphs

    def first_shapes(self) -> list[Shape]:
        """The graphs a warm-up makes by default: the shortest cache, one row and a padded round."""
        return [(rows, cache_bucket(1, self.max_cache_len)) for rows in sorted({1, self.max_batch})]

    def warm_up(self, shapes: list[Shape] | None = None) -> float:
        """Make these decode graphs (`first_shapes` by default) before a request pays for them;
        seconds. Other rounds make theirs when they first come (the log says so)."""
        started = time.perf_counter()
        for rows, length in shapes or self.first_shapes():
            seqs = [Sequence("Hello", SamplingParams(max_tokens=2, ignore_eos=True)) for _ in range(rows)]
            self.generate(seqs, self.encode([seq.prompt for seq in seqs]), cache_len=length)
        return time.perf_counter() - started

    def encode(self, prompts: list[Prompt]) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask: [B, S], left-padded to the longest prompt."""
        return self.pad([self.tokenize(p) for p in prompts])

    def tokenize(self, prompt: Prompt) -> list[int]:
        """One row's token ids, on its own so that a prompt that cannot be tokenized fails alone:
        text is tokenized, token ids are taken as they are. Never cut: the service checked the
        length (service/context_length.py); one longer than MAX_INPUT_TOKENS that got here fails its row."""
        ids = self.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
        if len(ids) > self.max_input_tokens:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than MAX_INPUT_TOKENS={self.max_input_tokens}")
        return ids

    def pad(self, ids: list[list[int]]) -> dict[str, torch.Tensor]:
        return self.tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt").to(self.device)

    @torch.inference_mode()
    def generate(
        self,
        seqs: list[Sequence],
        inputs: dict[str, torch.Tensor],
        failures: RowFailures | None = None,
        cache_len: int | None = None,
    ) -> list[str]:
        """Run one round: each sequence receives its tokens and text (streamed as they come);
        returns the finish reasons, in the order of `seqs`. The caller finishes the sequences.
        A row whose own work raised ends at once with reason "failed", its error in `failures`.
        `cache_len`: this static cache's graph (warm_up), not the round's own."""
        real, cache = len(seqs), None
        failures = failures if failures is not None else RowFailures()
        if cache_len is not None and self.step is not None:
            shape = (graph_width(len(seqs), self.max_batch), cache_len)
        else:
            shape = self.shape(inputs, max(s.params.max_tokens for s in seqs))
        cache_len = None if shape is None else shape[1]
        if shape is not None:
            seqs, inputs = pad_rows(seqs, inputs, shape[0])
            cache = static_cache(self.model, shape[0], cache_len, self.device)
            if shape not in self._graphs:
                log.info("static engine: compiling the decode step for %d row(s), a %d-token cache", *shape)
        cache, kept = self.prefix.before(seqs, inputs, cache, cache_len, self.model.config)  # batcher/static/prefix.py
        processors, recorder, sample = per_row.build(
            seqs, self.tokenizer, sorted(self.eos_ids), inputs["attention_mask"], self.model.config.vocab_size, failures
        )
        rows = RoundRows(seqs, self.tokenizer, self.eos_ids, recorder, failures)
        for seq, count in zip(seqs, inputs["attention_mask"].sum(dim=-1).tolist(), strict=True):
            seq.prompt_tokens = count  # the prompt as this round saw it, padding off
        compiling = shape is not None and shape not in self._graphs and self.device == "cpu"
        with (
            torch._inductor.config.patch(graphs.OPTIONS) if compiling else contextlib.nullcontext(),
            PromptLogprobs(seqs, inputs, self.tokenizer, failures).hooked(self.model),  # read off the prefill
        ):
            decode.generate(
                self.model,
                decode.next_logits if shape is None else self._graphs.get(shape, self.step),
                inputs,
                cache,
                processors,
                rows,
                sample,
                self.tokenizer.pad_token_id,
                max(s.params.max_tokens for s in seqs),
            )
        if shape is not None:  # compiled: this width and cache length's graph exists now
            self._graphs.setdefault(shape, self.step)
        self.prefix.after(kept)
        return [rows.finish(row) for row in range(real)]
