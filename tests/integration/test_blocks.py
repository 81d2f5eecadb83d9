"""The static engine reading the GGUF's own blocks (STATIC_WEIGHTS=blocks): every linear reads
the file's Q4_1 / Q8_0 blocks through the kernels, and the model's answers are the fp32
checkpoint's, to fp32's rounding (the checkpoint *is* those blocks, dequantized)."""

import pytest
import torch

from batcher.sampling import SamplingParams
from batcher.sequence import Sequence
from batcher.static import blocks
from batcher.static.blocks import BlockEmbedding, BlockLinear
from batcher.static.runner import Runner
from tests.helpers.workers import PROMPTS, run, static_settings


@pytest.fixture(scope="module")
def runner_blocks(model_path) -> Runner:
    return Runner(static_settings(model_path, static_weights="blocks", dtype="auto"))


def test_every_linear_reads_the_files_blocks_and_no_dense_weight_is_kept(runner_blocks):
    model = runner_blocks.model
    kinds = [m.kind for m in model.modules() if isinstance(m, BlockLinear)]
    assert kinds.count("q4_1") == 7 * model.config.num_hidden_layers and kinds.count("q8_0") == 1  # the head
    assert not [name for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    # the tied head's blocks serve the embeddings' lookup: what stays dense is the norms alone
    assert isinstance(model.get_input_embeddings(), BlockEmbedding)
    norms = (2 * model.config.num_hidden_layers + 1) * model.config.hidden_size
    assert sum(p.numel() for p in model.parameters()) == norms
    assert blocks._kernels is not None, "the kernels did not build: the fallback ran"
    assert runner_blocks.settings.shown()["dtype"] == "blocks"


def test_the_logits_are_the_fp32_checkpoints_to_rounding_with_the_kernels_and_without(runner_blocks, runner_fp32):
    inputs = runner_fp32.encode(PROMPTS)
    real = inputs["attention_mask"].bool()
    with torch.inference_mode():
        dense = runner_fp32.model(**inputs).logits[real]
        kernels = runner_blocks.model(**inputs).logits[real]
        built, blocks._kernels = blocks._kernels, None
        try:
            fallback = runner_blocks.model(**inputs).logits[real]
        finally:
            blocks._kernels = built
    for read in (kernels, fallback):
        assert (read - dense).abs().max() < 1e-3 * dense.abs().max()
        assert torch.equal(read.argmax(-1), dense.argmax(-1))


def test_greedy_answers_are_fp32s(runner_blocks, runner_fp32):
    seqs = lambda: [Sequence(p, SamplingParams(max_tokens=12)) for p in PROMPTS]  # noqa: E731
    assert run(runner_blocks, seqs()) == run(runner_fp32, seqs())


def test_a_gguf_file_serves_its_own_blocks_of_each_kind(tmp_path):
    """MODEL=<a GGUF file>: converted once into CACHE_DIR, and the static engine reads the file's
    Q4_0, Q4_1 and Q8_0 blocks as they are (a tiny llama written with gguf-py)."""
    from batcher.checkpoint import gguf_path
    from service.http.state import app_state
    from tests.helpers.apps import post, static_app
    from tests.helpers.tiny_gguf import LAYERS, write

    model = write(tmp_path / "tiny.gguf", gguf_path())
    with static_app(model=str(model), cache_dir=str(tmp_path / "models"), static_weights="blocks") as app:
        runner = app_state(app).engines["static"].runner
        kinds = [m.kind for m in runner.model.modules() if isinstance(m, BlockLinear)]
        assert {kind: kinds.count(kind) for kind in set(kinds)} == {"q4_0": 7, "q4_1": 7, "q8_0": 1}
        assert runner.model.config.num_hidden_layers == LAYERS
        reply = app.test_client().get("/static/v1/models")
        assert reply.json["data"][0]["id"] == "tiny"
        reply = post(app.test_client(), "/generate", {"prompts": ["Hello", "The sky is"], "max_tokens": 5})
        assert reply.status_code == 200, reply.json
        assert len(reply.json["generated_texts"]) == 2


def test_a_model_that_cannot_load_stops_with_one_line_naming_model(tmp_path):
    import subprocess
    import sys

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a GGUF file")
    env = {"MODEL": str(broken), "CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "batcher.checkpoint"], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(f"MODEL={broken} cannot be loaded: ")
