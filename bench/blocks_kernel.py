"""The block kernels against torch's dense linears, on one decode step's weights of SmolLM2-135M:
`python -m bench.blocks_kernel`. Every layer has weights of its own, as in the model, so nothing
stays in cache from one layer to the next; a pass is the 30 layers' 7 linears and the head (Q8_0,
as llama.cpp's Q4_1 files keep it), at 1 and at 4 rows of x, on 2 torch threads. Prints the median
ms of 7 passes for each way of reading the weights."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from batcher.static import blocks

LAYERS = 30
LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # [N, K]
HEAD = (49152, 576)
PASSES, THREADS, ROWS = 7, 2, (1, 4)
COLUMNS = ("Q4_1 kernel", "fp32 F.linear", "fp16 F.linear", "oneDNN packed fp32")  # the head: Q8_0 in the first


def cpu_name() -> str:
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown CPU")


def step_shapes() -> list[tuple[str, int, int]]:
    """(kind, N, K) of every linear one decode step reads, in order."""
    return [("q4_1", n, k) for _ in range(LAYERS) for n, k in LAYER] + [("q8_0", *HEAD)]


def random_blocks(kind: str, n: int, k: int) -> torch.Tensor:
    """Random codes under a scale (and offset) of 0.01: finite, normal numbers, like a model's."""
    width = blocks.BLOCK_BYTES[kind]
    data = torch.randint(0, 256, (n, k // blocks.QK, width), dtype=torch.uint8)
    scales = 4 if kind == "q4_1" else 2
    data[..., :scales] = torch.full((scales // 2,), 0.01, dtype=torch.float16).view(torch.uint8)
    return data.reshape(n, -1)


def median_ms(one_pass: Callable[[], None]) -> float:
    one_pass()  # warm: first-touch pages, oneDNN's primitive cache
    times = []
    for _ in range(PASSES):
        start = time.perf_counter()
        one_pass()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def columns(shapes, rows: int) -> dict[str, Callable[[], float]]:
    """Each way of reading the step's weights: a function that builds its weights, times the
    passes and frees them (one form in memory at a time: fp32 alone is 0.5 GB)."""
    xs = {k: torch.randn(rows, k) for k in {k for _, _, k in shapes}}

    def kernel() -> float:
        ws = [(blocks.op(kind), random_blocks(kind, n, k), n, k) for kind, n, k in shapes]
        return median_ms(lambda: [fn(xs[k], w, n, k) for fn, w, n, k in ws])

    def dense(dtype: torch.dtype) -> float:
        ws = [torch.randn(n, k).mul_(0.02).to(dtype) for _, n, k in shapes]
        x = {k: v.to(dtype) for k, v in xs.items()}
        return median_ms(lambda: [F.linear(x[w.shape[1]], w) for w in ws])

    def packed() -> float:
        pack = torch.ops.mkldnn._reorder_linear_weight
        ws = [(pack(torch.randn(n, k).mul_(0.02), rows), xs[k]) for _, n, k in shapes]
        return median_ms(lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w, x in ws])

    return {
        COLUMNS[0]: kernel,
        COLUMNS[1]: lambda: dense(torch.float32),
        COLUMNS[2]: lambda: dense(torch.float16),
        COLUMNS[3]: packed,
    }


def main() -> None:
    torch.set_num_threads(THREADS)
    kernels = blocks.build()
    shapes = step_shapes()
    mb = sum(n * k // blocks.QK * blocks.BLOCK_BYTES[kind] for kind, n, k in shapes) / 1e6
    print(f"# {cpu_name()}, {THREADS} threads, torch {torch.__version__}, kernels: {kernels and kernels.isa()}")
    print(f"# a decode step of SmolLM2-135M: {len(shapes)} linears, {mb:.0f} MB of blocks; ms, median of {PASSES}")
    print("| rows | " + " | ".join(COLUMNS) + " |")
    print("|---" * (1 + len(COLUMNS)) + "|")
    with torch.inference_mode():
        for rows in ROWS:
            cells = []
            for name, timed in columns(shapes, rows).items():
                if name == COLUMNS[0] and kernels is None:
                    cells.append("not built")
                    continue
                try:
                    cells.append(f"{timed():.2f}")
                except RuntimeError as error:  # fp16 matmul is missing on some CPUs and torch builds
                    cells.append(f"fails: {str(error).splitlines()[0][:40]}")
            print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
