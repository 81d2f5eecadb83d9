"""A start of the static engine with the GGUF's blocks compiled, in a process of its own, as a
service restart would be: `python -m tests.helpers.compiled_start MODEL_PATH SETTINGS_JSON PROMPT`
prints one JSON line: the first graphs loaded (batcher/static/graphs.py), what Dynamo traced
meanwhile (nothing, where they were stored) and the prompt's greedy text (8 tokens)."""

from __future__ import annotations

import json
import sys

from batcher.compile_cache import import_torch_first, use_compile_cache


def main(model_path: str, settings: str, prompt: str) -> None:
    import_torch_first()  # as the service does: the caches' keys depend on it
    use_compile_cache("", "cpu")  # as the service does (its folder: TORCHINDUCTOR_CACHE_DIR, as given)
    from torch._dynamo.utils import counters

    from batcher.sampling import SamplingParams
    from batcher.sequence import Sequence
    from batcher.static import graphs
    from batcher.static.runner import Runner
    from tests.helpers.workers import run, static_settings

    config = {"static_weights": "blocks", "static_compile": "1", "batch_size": 4, **json.loads(settings)}
    runner = Runner(static_settings(model_path, **config))
    loaded = 0
    for shape in runner.first_shapes():
        step = graphs.load(runner.settings, shape)
        if step is not None:
            runner.use_graph(shape, step)
            loaded += 1
    [(text, _)] = run(runner, [Sequence(prompt, SamplingParams(max_tokens=8))])
    made = {"loaded": loaded, "traced": counters["stats"]["unique_graphs"]}
    print(json.dumps({**made, "text": text}))


if __name__ == "__main__":
    main(*sys.argv[1:])
