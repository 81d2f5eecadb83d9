"""A tiny llama model written to a GGUF file with gguf-py, as llama.cpp's tools write one: the
default model's tokenizer (its fields copied from the shipped file), two layers of random weights
quantized to Q4_0 (layer 0) and Q4_1 (layer 1), the embeddings (the tied head) in Q8_0."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# heads of 32: the smallest vLLM's CPU attention takes (a GGUF file serves on both engines)
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 64, 128, 2, 1, 2
LAYER_TYPES = ("Q4_0", "Q4_1")


def write(path: Path, source: Path, seed: int = 0) -> Path:
    """The tiny model at `path`, its tokenizer from the GGUF at `source`."""
    import gguf
    from gguf.quants import quantize

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    vocab = int(reader.fields["llama.vocab_size"].contents())
    writer.add_block_count(LAYERS)
    writer.add_context_length(2048)  # VLLM_MAX_MODEL_LEN's default: vLLM takes no more than the model says
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def add(name: str, rows: int, cols: int, kind: str) -> None:
        weights = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, quantize(weights, qtype), raw_dtype=qtype)  # shape: from the bytes

    add("token_embd.weight", vocab, HIDDEN, "Q8_0")
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for layer, kind in enumerate(LAYER_TYPES):
        shapes = {
            "attn_q": (HIDDEN, HIDDEN),
            "attn_k": (KV_HEADS * head_dim, HIDDEN),
            "attn_v": (KV_HEADS * head_dim, HIDDEN),
            "attn_output": (HIDDEN, HIDDEN),
            "ffn_gate": (FFN, HIDDEN),
            "ffn_up": (FFN, HIDDEN),
            "ffn_down": (HIDDEN, FFN),
        }
        for part, (rows, cols) in shapes.items():
            add(f"blk.{layer}.{part}.weight", rows, cols, kind)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
