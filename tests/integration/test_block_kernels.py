"""The block kernels (batcher/static/kernels/blocks.cpp) and their torch fallback against the
dequantized matrix in float64, on random blocks: every kind, every vector path this CPU runs, one
row to a prefill's many. No model, but torch: the integration tier (the unit tier loads no model
library). The kernels build once under the compile cache, as `make setup` builds them (a minute
the first time, then seconds), and the tests skip, saying why, where they cannot build."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("q4_1", "q4_0", "q8_0")
PATHS = ("avx512", "avx2", "scalar")
# rows: every tile width (8 with AVX-512, 4 with AVX2) and remainder; the GEMM's passes (16 rows
# with AVX2, 64 with AVX-512), full and partial (24 and 47 with AVX2, 64 and 130 with AVX-512);
# the dense path (64 and up with AVX2, 300). outputs: the GEMM's panels of 6 and groups of 48, and parts
INPUTS, OUTPUTS, ROWS = (64, 576, 1536), (1, 7, 50, 576), (1, 2, 3, 4, 5, 8, 9, 13, 24, 47, 64, 130, 300)
# of |x| @ |W|^T, each output's scale: fp32 rounding summed over K terms in some order (about 1e-7
# here), far under a wrong block, nibble or scale (1e-2 and up)
TOLERANCE = 2e-6


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def blocks(torch):
    from batcher.static import blocks

    return blocks


@pytest.fixture(scope="module")
def kernels(blocks):
    module = blocks.build(ROOT / blocks.DEFAULT_KERNEL_DIR)
    if module is None:
        pytest.skip("the block kernels do not build here: blocks.build logged why")
    return module


@pytest.fixture(params=PATHS)
def path(request, kernels):
    """Each path this CPU runs, forced; the best one back afterwards (the module is process-wide)."""
    best = kernels.isa()
    if PATHS.index(request.param) < PATHS.index(best):
        pytest.skip(f"this CPU does not run {request.param}")
    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa(best)


def random_blocks(torch, kind: str, n: int, k: int, generator):
    """Random codes under random scales of a model's magnitude: Q4_1's d > 0 and its offset m
    about -8 d (a block's minimum); Q4_0's and Q8_0's d of either sign."""
    from batcher.static.blocks import BLOCK_BYTES

    data = torch.randint(0, 256, (n, k // 32, BLOCK_BYTES[kind]), dtype=torch.uint8, generator=generator)
    d = (0.005 + 0.015 * torch.rand(n, k // 32, 1, generator=generator)).half()
    if kind == "q4_1":
        m = (-d.float() * (4 + 8 * torch.rand(n, k // 32, 1, generator=generator))).half()
        data[..., 2:4] = m.view(torch.uint8)
    else:
        d = torch.where(torch.rand(d.shape, generator=generator) < 0.5, -d, d)
    data[..., 0:2] = d.view(torch.uint8)
    return data.reshape(n, -1)


def worst_error(torch, y, x, w):
    """max |y - x @ w^T| over |x| @ |w|^T, in float64."""
    x, w = x.double().reshape(-1, w.shape[1]), w.double()
    scale = (x.abs() @ w.abs().T).clamp_min(1e-300)
    return ((y.double().reshape(x.shape[0], -1) - x @ w.T).abs() / scale).max().item()


def test_a_hand_built_block_of_each_kind_holds_the_formulas_weights(torch, blocks):
    codes = torch.tensor([0x21] + [0xF0] * 15, dtype=torch.uint8)  # j = 0: low 1, high 2; j > 0: low 0, high 15
    half = {v: torch.tensor([v], dtype=torch.float16).view(torch.uint8) for v in (0.5, -3.0)}
    q4_1 = blocks.dequantize("q4_1", torch.cat([half[0.5], half[-3.0], codes])[None], 1, 32)[0].tolist()
    assert (q4_1[0], q4_1[16], q4_1[1], q4_1[17]) == (0.5 - 3, 1 - 3, -3, 7.5 - 3)
    q4_0 = blocks.dequantize("q4_0", torch.cat([half[0.5], codes])[None], 1, 32)[0].tolist()
    assert (q4_0[0], q4_0[16], q4_0[1], q4_0[17]) == (-3.5, -3, -4, 3.5)
    signed = torch.arange(-16, 16, dtype=torch.int8).view(torch.uint8)
    q8_0 = blocks.dequantize("q8_0", torch.cat([half[-3.0], signed])[None], 1, 32)[0]
    assert q8_0.tolist() == [-3.0 * c for c in range(-16, 16)]


@pytest.mark.parametrize("k", INPUTS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_matches_the_dequantized_matrix(torch, blocks, kernels, path, kind, k):
    generator = torch.Generator().manual_seed(k)
    linear = blocks.op(kind)
    for n in OUTPUTS:
        w = random_blocks(torch, kind, n, k, generator)
        dense = blocks.dequantize(kind, w, n, k)
        for m in ROWS:
            x = torch.randn(m, k, generator=generator)
            y = linear(x, w, n, k)
            assert y.shape == (m, n) and y.dtype == torch.float32
            error = worst_error(torch, y, x, dense)
            assert error < TOLERANCE, f"{path} {kind} N={n} K={k} M={m}: {error:.2e}"


@pytest.mark.parametrize("kind", ("q4_1", "q4_0"))
def test_every_finite_fp16_scale_reads_as_torch_reads_it(torch, blocks, kernels, path, kind):
    """Subnormal, tiny and huge scales too: the vector paths read them through a table that the
    scalar path's own conversion filled."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = every[torch.isfinite(every)]
    generator = torch.Generator().manual_seed(0)
    w = random_blocks(torch, kind, finite.numel(), 32, generator).reshape(finite.numel(), 1, -1)
    w[:, 0, 0:2] = finite[:, None].view(torch.uint8)
    if kind == "q4_1":
        w[:, 0, 2:4] = finite.flip(0)[:, None].view(torch.uint8)
    w = w.reshape(finite.numel(), -1)
    x = torch.randn(1, 32, generator=generator)
    y = blocks.op(kind)(x, w, finite.numel(), 32)
    assert worst_error(torch, y, x, blocks.dequantize(kind, w, finite.numel(), 32)) < TOLERANCE


@pytest.mark.parametrize("kind", KINDS)
def test_the_layer_gives_the_same_answer_with_and_without_the_kernels(torch, blocks, kernels, kind):
    generator = torch.Generator().manual_seed(1)
    w, bias = random_blocks(torch, kind, 7, 576, generator), torch.randn(7, generator=generator)
    layer = blocks.BlockLinear(kind, w, 7, 576, bias)
    assert dict(layer.named_buffers()).keys() == {"blocks", "bias"}  # .to() and state_dict carry them
    dense = blocks.dequantize(kind, w, 7, 576)
    x = torch.randn(2, 65, 576, generator=generator)  # [batch, tokens, in]: 130 rows
    expected = torch.nn.functional.linear(x.double(), dense.double(), bias.double())
    before = blocks._kernels
    try:
        for module in (kernels, None):
            blocks.use_kernels(module)
            y = layer(x)
            assert y.shape == (2, 65, 7)
            scale = x.double().abs() @ dense.double().abs().T + bias.double().abs()
            assert ((y.double() - expected).abs() / scale).max().item() < TOLERANCE, module
    finally:
        blocks.use_kernels(before)


WRONG = {  # what is changed in a right call (x [2, 64], w [3, 2 blocks], N=3, K=64): what the refusal says
    "x-dtype": (lambda torch, x, w: (x.double(), w, 3, 64), "x must be float32"),
    "x-width": (lambda torch, x, w: (x[:, :32].contiguous(), w, 3, 64), r"x must be \[M, K=64\]"),
    "x-strides": (lambda torch, x, w: (x.t().contiguous().t(), w, 3, 64), "x must be contiguous"),
    "w-width": (lambda torch, x, w: (x, w[:, :-1].contiguous(), 3, 64), r"w must be \[N=3"),
    "w-dims": (lambda torch, x, w: (x, w.reshape(-1), 3, 64), r"w must be \[N=3"),
    "w-dtype": (lambda torch, x, w: (x, w.view(torch.int8), 3, 64), "w must be uint8"),
    "k": (lambda torch, x, w: (x, w, 3, 48), r"K \(in_features\) must be a positive multiple of 32"),
    "n": (lambda torch, x, w: (x, w, 0, 64), r"N \(out_features\) must be positive"),
}


@pytest.mark.parametrize("wrong", WRONG)
def test_a_wrong_operand_is_refused_naming_it(torch, blocks, kernels, wrong):
    change, message = WRONG[wrong]
    x = torch.randn(2, 64)
    for kind, width in (("q4_1", 20), ("q4_0", 18), ("q8_0", 34)):
        w = torch.zeros(3, 2 * width, dtype=torch.uint8)
        with pytest.raises(RuntimeError, match=f"{kind}_linear: {message}"):
            blocks.op(kind)(*change(torch, x, w))


def test_building_again_gives_the_module_loaded_whatever_the_folders_spelling(blocks, kernels, tmp_path):
    """A second copy of the library would register its operators again, which aborts the process
    (a test worker loads the kernels through an absolute folder here, a relative one in a Runner)."""
    assert blocks.build(blocks.DEFAULT_KERNEL_DIR) is kernels
    assert blocks.build(tmp_path) is kernels and not list(tmp_path.iterdir())  # nothing built there


def test_a_path_the_cpu_lacks_or_that_does_not_exist_is_refused(kernels):
    with pytest.raises(RuntimeError, match="unknown path"):
        kernels.set_isa("neon")
    assert kernels.isa() in PATHS


def test_the_layer_refuses_blocks_of_the_wrong_shape(torch, blocks):
    with pytest.raises(ValueError, match=r"q4_1 blocks must be uint8 \[7, 360\]"):
        blocks.BlockLinear("q4_1", torch.zeros(7, 340, dtype=torch.uint8), 7, 576)
    with pytest.raises(ValueError, match="unknown block kind"):
        blocks.BlockLinear("q5_0", torch.zeros(7, 360, dtype=torch.uint8), 7, 576)
