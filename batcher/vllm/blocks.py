"""vLLM's linears reading the GGUF's own blocks with fp32 arithmetic: the static engine's kernels
(batcher/static/blocks.py) carried into vLLM through its quantization-method interface.

vLLM's own GGUF path is CUDA-only, and its CPU 4-bit kernels hold no Q4_1 minimum. So the engine
loads the converted checkpoint (fp32) as always, and each linear whose parts the GGUF holds as
blocks of one kind (q, k and v make vLLM's `qkv_proj`; gate and up its `gate_up_proj`: their rows
stacked) swaps its weight for those blocks once loaded, after checking that they dequantize to
exactly the weight it loaded, and calls the kernel from then on; the tied head reads the
embeddings' Q8_0 blocks and leaves the table to the lookup. A linear whose parts are dense or of
mixed kinds keeps vLLM's own method. fp32 activations, weights as the file holds them: fp32's
answers (docs/performance.md#the-vllm-engine-on-the-ggufs-blocks).

`register()` makes the method known to vLLM (once a process; the engine is in-process), and
`engine_args` names it with the GGUF file, which the config carries to `from_config`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)
NAME = "llm_gguf_blocks"
# vLLM's stacked linears and the checkpoint's parts they hold, row after row
STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_registered = False


def quantization_config(source: Path, kernel_dir: str) -> dict:
    """What the model's config carries for `from_config` (through vLLM's hf_overrides)."""
    return {"quant_method": NAME, "source": str(source), "kernel_dir": kernel_dir}


def stacked(prefix: str, found: dict) -> list | None:
    """The blocks (gguf_blocks.read's, by transformers' names) of the checkpoint's parts of vLLM's
    layer `prefix`, in vLLM's row order; None unless the file holds every part, all of one kind."""
    parent, _, leaf = prefix.rpartition(".")
    parts = [found.get(f"{parent}.{part}" if parent else part) for part in STACKED.get(leaf, (leaf,))]
    if any(part is None for part in parts) or len({part.kind for part in parts}) != 1:
        return None
    return parts


def register() -> None:
    """Our method, known to vLLM by NAME from here on (its classes subclass vLLM's: built here, so
    that importing this module imports no vLLM)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization import register_quantization_config
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    from batcher.static import blocks, gguf_blocks

    def attach(layer, parts, keep_weight: bool) -> bool:
        """The blocks on `layer`, once shown to hold its weight; False (logged): they do not."""
        data = torch.cat([part.data for part in parts]).contiguous()
        kind, rows, inputs = parts[0].kind, data.shape[0], parts[0].in_features
        weight = layer.weight.data
        if weight.shape != (rows, inputs) or not torch.equal(blocks.dequantize(kind, data, rows, inputs), weight):
            log.warning("vLLM engine: %s stays dense: its GGUF blocks do not hold the weight it loaded", layer.prefix)
            return False
        # the static engine's layer (its kernel, or the torch fallback where none built); not a submodule
        layer.__dict__["blocks"] = blocks.BlockLinear(kind, data, rows, inputs)
        if not keep_weight:  # one copy: the blocks
            layer.weight = torch.nn.Parameter(weight.new_empty(0), requires_grad=False)
        return True

    def linear(layer, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = layer.blocks(x)
        return y if bias is None else y + bias

    class BlocksLinear(UnquantizedLinearMethod):
        def __init__(self, parts):
            super().__init__()
            self.parts = parts

        def process_weights_after_loading(self, layer) -> None:
            if not attach(layer, self.parts, keep_weight=False):
                super().process_weights_after_loading(layer)

        def apply(self, layer, x, bias=None):
            return linear(layer, x, bias) if "blocks" in layer.__dict__ else super().apply(layer, x, bias)

    class BlocksHead(UnquantizedEmbeddingMethod):
        def __init__(self, parts):
            super().__init__()
            self.parts = parts

        def process_weights_after_loading(self, layer) -> None:
            if not attach(layer, self.parts, keep_weight=True):  # tied: the table stays, for lookups
                super().process_weights_after_loading(layer)

        def apply(self, layer, x, bias=None):
            return linear(layer, x, bias) if "blocks" in layer.__dict__ else super().apply(layer, x, bias)

    @register_quantization_config(NAME)
    class GGUFBlocks(QuantizationConfig):
        def __init__(self, source: str, kernel_dir: str):
            super().__init__()
            blocks.use_kernels(blocks.build(kernel_dir))  # built by `make setup`: loaded in a second
            self.found, dense = gguf_blocks.read(source)
            log.info("vLLM engine: %d linears of %s read as blocks (%d dense)", len(self.found), source, len(dense))

        def get_name(self):
            return NAME

        def get_supported_act_dtypes(self):
            return [torch.float32]

        @classmethod
        def get_min_capability(cls) -> int:
            return 0

        @staticmethod
        def get_config_filenames() -> list[str]:
            return []

        @classmethod
        def from_config(cls, config: dict) -> GGUFBlocks:
            return cls(config["source"], config["kernel_dir"])

        def get_quant_method(self, layer, prefix: str):
            parts = stacked(prefix, self.found)
            if isinstance(layer, LinearBase):
                return BlocksLinear(parts) if parts else UnquantizedLinearMethod()
            if isinstance(layer, ParallelLMHead) and parts:
                return BlocksHead(parts)
            return None  # the embeddings' lookup: vLLM's own

    _registered = True
