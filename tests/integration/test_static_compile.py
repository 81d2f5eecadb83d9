"""STATIC_COMPILE: the static engine decoding through a compiled step over a static KV cache.

On a tiny llama written to a GGUF file (tests/helpers/tiny_gguf.py: the default model's tokenizer,
two layers), in both compiled forms: dense fp32 (its weights packed for oneDNN) and the GGUF's
blocks, each read by the graphs as inputs (one copy of the weights); a start without its graphs
serves eager while a child process builds them, and a later start loads them, which tests here
check (the blocks' form, in processes of their own too). The runner-level tests run
eager and compiled: per-row parameters, streaming and cancellation must hold either way, and each
compiled runner must give its eager runner's tokens. Every round here fits one cache length (64):
two graphs a form, one row and a round padded to the batch size (4), compiled once for the module
by warm_up (their cost: docs/testing.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from batcher import fence
from batcher.sampling import SamplingParams
from batcher.sequence import Sequence
from batcher.static import graphs
from batcher.static.runner import Runner
from batcher.static.shapes import cache_bucket, static_cache
from batcher.static.worker import StaticWorker
from service import create_app, shutdown
from service.config import Config
from service.http.state import app_state
from service.ops.health import engine_health
from tests.helpers import wait_until
from tests.helpers.apps import post
from tests.helpers.workers import PROMPTS, run, static_settings

SMALL = {"max_input_tokens": 24, "max_new_tokens_limit": 40}  # 64: one cache length for every round
FORMS = {"dense": {"dtype": "float32"}, "blocks": {"static_weights": "blocks"}}
CHILD = "tests.helpers.compiled_start"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """The tiny model's GGUF file, and its checkpoint folder (converted as the service does)."""
    from batcher.checkpoint import gguf_path, resolve_model
    from tests.helpers.tiny_gguf import write

    folder = tmp_path_factory.mktemp("tiny")
    source = write(folder / "tiny.gguf", gguf_path())
    return str(source), resolve_model(str(source), folder / "models")


@pytest.fixture(scope="module")
def inductor(tmp_path_factory) -> Iterator[Path]:
    """One Inductor cache for the module's compiles, in this process and in the build children it
    starts: a build is mostly the C++ of its kernels and of cpp_wrapper, the same code for the
    same shapes, so each is compiled once here. The graph files are keyed by the model's path
    (graphs._stem): a test that must find none stored uses a model folder of its own, or a cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


@pytest.fixture(scope="module")
def eager_runners(tiny) -> dict[str, Runner]:
    return {form: Runner(static_settings(tiny[1], **settings, **SMALL)) for form, settings in FORMS.items()}


@pytest.fixture(scope="module")
def compiled_runners(tiny, inductor) -> dict[str, Runner]:
    runners = {}
    for form, settings in FORMS.items():
        runner = Runner(static_settings(tiny[1], static_compile="1", batch_size=4, **settings, **SMALL))
        # compiling patches torch process-wide: not while another test's vLLM engine builds or steps
        with fence.model_work(), fence.static_round():
            assert runner.compiles and runner.warm_up() > 0
        runners[form] = runner
    return runners


@pytest.fixture(params=list(FORMS))
def pair(request, eager_runners, compiled_runners) -> tuple[Runner, Runner]:
    """(eager, compiled) of one form."""
    return eager_runners[request.param], compiled_runners[request.param]


@pytest.fixture(params=["eager", "dense", "blocks"])
def runner(request, eager_runners, compiled_runners) -> Runner:
    return eager_runners["dense"] if request.param == "eager" else compiled_runners[request.param]


def mixed_round() -> list[Sequence]:
    """Four rows, four kinds of parameters, in one round."""
    return [
        Sequence(PROMPTS[0], SamplingParams(max_tokens=12, logprobs=2)),
        Sequence(PROMPTS[1], SamplingParams(max_tokens=6, temperature=0.8, seed=11, ignore_eos=True)),
        Sequence(PROMPTS[2], SamplingParams(max_tokens=16, stop=(" the",))),
        Sequence(PROMPTS[3], SamplingParams(max_tokens=10, repetition_penalty=1.3, top_k=5, ignore_eos=True)),
    ]


def test_compiled_decoding_gives_the_eager_tokens_row_for_row(pair):
    eager, fast = mixed_round(), mixed_round()
    assert run(pair[0], eager) == run(pair[1], fast)
    for a, b in zip(eager, fast, strict=True):
        assert a.token_ids == b.token_ids and a.prompt_tokens == b.prompt_tokens
        assert [t.token_id for t in a.logprobs] == [t.token_id for t in b.logprobs]
        assert [t.logprob for t in a.logprobs] == pytest.approx([t.logprob for t in b.logprobs], abs=1e-3)
    assert len(fast[0].logprobs) == len(fast[0].token_ids) and len(fast[0].logprobs[0].top) == 2


def test_per_row_max_tokens_stop_and_seed_hold(runner):
    [(alone, _)] = run(runner, [Sequence(PROMPTS[2], SamplingParams(max_tokens=12, ignore_eos=True))])
    stop = alone[len(alone) // 2 :][:3]  # three characters from the middle of its text
    seeded = SamplingParams(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)
    rows = [
        Sequence(PROMPTS[0], SamplingParams(max_tokens=3, ignore_eos=True)),
        Sequence(PROMPTS[1], seeded),
        Sequence(PROMPTS[2], SamplingParams(max_tokens=12, stop=(stop,), ignore_eos=True)),
    ]
    (short, short_reason), (sampled, _), (stopped, stop_reason) = run(runner, rows)
    assert len(rows[0].token_ids) == 3 and short_reason == "length"
    assert stop_reason == "stop" and stopped == alone[: alone.index(stop)]
    # the same seed gives the same text in another round, beside other rows
    again = [Sequence(PROMPTS[3], SamplingParams(max_tokens=5)), Sequence(PROMPTS[1], seeded)]
    assert run(runner, again)[1][0] == sampled


def test_streamed_pieces_join_into_each_rows_text(runner):
    pieces = queue.SimpleQueue()
    rows = [Sequence(p, SamplingParams(max_tokens=10, ignore_eos=True), pieces=pieces) for p in PROMPTS]
    results = run(runner, rows)
    streamed = {seq.id: "" for seq in rows}
    while not pieces.empty():
        seq, text = pieces.get()
        streamed[seq.id] += text
    assert [streamed[seq.id] for seq in rows] == [text for text, _ in results]
    assert all(len(seq.token_ids) == 10 for seq in rows)


def test_a_cancelled_row_stops_while_the_others_run_to_their_end(runner):
    pieces = queue.SimpleQueue()
    rows = [Sequence(p, SamplingParams(max_tokens=30, ignore_eos=True), pieces=pieces) for p in PROMPTS[:3]]
    results = {}
    worker = threading.Thread(target=lambda: results.update(reasons=runner.generate(rows, runner.encode(PROMPTS[:3]))))
    worker.start()
    while pieces.get(timeout=300)[0] is not rows[0]:
        pass  # until the first piece of the row to cancel: it is running
    rows[0].cancel()
    worker.join(300)
    assert results["reasons"][0] == "cancelled" and len(rows[0].token_ids) < 30
    assert results["reasons"][1:] == ["length", "length"]
    assert [len(s.token_ids) for s in rows[1:]] == [30, 30]


def test_a_short_round_is_padded_but_returns_only_its_own_rows(pair):
    def rows():
        return [Sequence(p, SamplingParams(max_tokens=8)) for p in PROMPTS[:2]]

    eager, fast = rows(), rows()
    reasons = pair[1].generate(fast, pair[1].encode(PROMPTS[:2]))
    assert len(reasons) == 2  # the padding rows are not returned
    assert [(seq.text, reason) for seq, reason in zip(fast, reasons, strict=True)] == run(pair[0], eager)


def test_one_prompt_runs_its_own_graph_and_a_round_of_two_or_more_the_padded_one(pair):
    """warm_up compiled both widths (graph_width): neither a lone prompt nor a round of three
    compiles anything new."""
    from torch._dynamo.utils import counters

    compiled, graphs = pair[1], counters["stats"]["unique_graphs"]
    for prompts in (PROMPTS[:1], PROMPTS[:3]):
        assert not compiled.needs_compile(compiled.encode(prompts), 8)
        run(compiled, [Sequence(p, SamplingParams(max_tokens=8)) for p in prompts])
    assert counters["stats"]["unique_graphs"] == graphs
    assert {width for width, _ in compiled._graphs} == {1, 4}


def test_prompt_logprobs_come_from_the_eager_prefill_and_compile_nothing_new(pair):
    from torch._dynamo.utils import counters

    def rows():
        return [
            Sequence(PROMPTS[0], SamplingParams(max_tokens=4, prompt_logprobs=2)),
            Sequence(PROMPTS[3], SamplingParams(max_tokens=4)),
        ]

    eager_runner, compiled = pair
    run(compiled, [Sequence(PROMPTS[0], SamplingParams(max_tokens=4))])  # this round's graph exists
    graphs = counters["stats"]["unique_graphs"]
    eager, fast = rows(), rows()
    assert run(eager_runner, eager) == run(compiled, fast)
    assert counters["stats"]["unique_graphs"] == graphs  # the decode step ran the graph it had
    assert fast[1].prompt_logprobs is None
    mine, theirs = fast[0].prompt_logprobs, eager[0].prompt_logprobs
    assert [r.token_id for r in mine] == [r.token_id for r in theirs] and mine[0].logprob is None
    assert [r.logprob for r in mine[1:]] == pytest.approx([r.logprob for r in theirs[1:]], abs=1e-4)
    assert [[t for t, _, _ in r.top] for r in mine] == [[t for t, _, _ in r.top] for r in theirs]


def test_the_graphs_a_child_builds_are_loaded_by_a_later_start(tiny, eager_runners, inductor):
    """The blocks' graphs, built by the child a start without them runs (batcher/static/graphs.py,
    as the profile's child also builds them), are loaded by the next start, a process of its own:
    nothing traced or compiled again, and the eager runner's tokens. Two builds at once (two replicas' starts)
    build them once: the second waits for the first, then finds them stored."""
    env = dict(os.environ)  # the module's Inductor cache (`inductor`): no other test builds this model's graphs
    settings = static_settings(tiny[1], static_weights="blocks", static_compile="1", batch_size=4, **SMALL)
    shapes = json.dumps([[1, 64], [4, 64]])  # what a start warms up (Runner.first_shapes)
    build = [sys.executable, "-m", "batcher.static.graphs", json.dumps(dataclasses.asdict(settings)), shapes]
    builds = [subprocess.Popen(build, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    logs = [process.communicate(timeout=600)[1] for process in builds]
    assert [process.returncode for process in builds] == [0, 0], logs
    built = sorted("built and stored" in log for log in logs)
    assert built == [False, True] and any("stored by another process" in log for log in logs), logs
    start = [sys.executable, "-m", CHILD, tiny[1], json.dumps(SMALL), PROMPTS[0]]
    done = subprocess.run(start, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    later = json.loads(done.stdout.strip().splitlines()[-1])
    assert later["loaded"] == 2 and later["traced"] == 0, later
    expected = run(eager_runners["blocks"], [Sequence(PROMPTS[0], SamplingParams(max_tokens=8))])[0][0]
    assert later["text"] == expected


def test_the_dense_forms_graph_is_built_aside_and_reads_the_models_one_copy_of_its_weights(
    tiny, compiled_runners, inductor
):
    """The dense fp32 form is built aside and stored too (graphs.builds_aside), and its graph holds
    code alone: the stored file is smaller than the weights, and the loaded graph reads the
    model's own packed linears at every call, so a weight replaced after the build is the one it
    uses (a frozen graph would hold its copy of the old ones)."""
    import torch

    from batcher.static.linear import PackedLinear

    runner = compiled_runners["dense"]
    assert graphs.builds_aside(runner.settings) and isinstance(runner.model.lm_head, PackedLinear)
    assert graphs.build(runner, [(1, 64)]) > 0 and graphs.stored(runner.settings, (1, 64))
    weights = sum(t.numel() * t.element_size() for t in runner.model.state_dict().values())
    assert graphs._path(runner.settings, (1, 64)).stat().st_size < weights
    graph = graphs.load(runner.settings, (1, 64))
    cache = static_cache(runner.model, 1, 64, runner.device)
    step = (
        torch.zeros(1, 1, dtype=torch.long),
        torch.ones(1, 64, dtype=torch.long),
        torch.zeros(1, 1, dtype=torch.long),
    )
    head = runner.model.lm_head
    with torch.inference_mode():
        assert graph(runner.model, step[0], step[1], step[2], cache).abs().max() > 0
        zeros = torch.zeros(head.out_features, head.in_features)
        runner.model.lm_head = PackedLinear(zeros, None, runner.max_batch)
        try:
            logits = graph(runner.model, step[0], step[1], step[2], cache)
        finally:
            runner.model.lm_head = head
    assert logits.abs().max() == 0


def test_a_stored_graph_that_cannot_be_loaded_is_removed_to_be_built_again(tiny, tmp_path, monkeypatch, caplog):
    """A graph file cut short, or written by another torch: no graph, a line saying so, and the
    file gone, so that the next round that needs it has it built (never a failed round)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    settings = static_settings(tiny[1], static_weights="blocks", static_compile="1", batch_size=4, **SMALL)
    path = graphs._path(settings, (1, 64))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"half a graph")
    assert graphs.stored(settings, (1, 64))
    assert graphs.load(settings, (1, 64)) is None
    assert not graphs.stored(settings, (1, 64)) and "cannot be loaded" in caplog.text


def state(pid: int) -> str:
    """A process's state letter (/proc/PID/stat): "T" stopped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_build_runs_only_while_the_worker_serves_nothing(tiny, tmp_path, monkeypatch):
    """Beside requests a build slowed the worker's answers whatever its CPU priority: it is
    stopped while the worker holds requests, and continued once it holds none (graphs.Build)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    settings = static_settings(tiny[1], static_weights="blocks", static_compile="1", batch_size=4, **SMALL)
    serving = threading.Event()
    serving.set()
    build = graphs.Build(settings, [(1, 64)], busy=serving.is_set)
    try:
        for busy in (True, False, True):
            serving.set() if busy else serving.clear()
            wait_until(lambda b=busy: (state(build.process.pid) == "T") == b, 30, f"the build {'stopped' * busy}")
    finally:
        build.stop()
    assert build.done() is False and not graphs.stored(settings, (1, 64))


@pytest.mark.parametrize("paused", [False, True])
def test_a_build_child_ends_with_the_worker_that_started_it_even_one_killed(tiny, tmp_path, monkeypatch, paused):
    """A worker killed with SIGKILL runs no clean-up: its build child must not run on alone to
    its end (batcher/static/graphs.py: the parent-death signal), nor stay stopped for good, if the
    worker served meanwhile (the kernel continues an orphaned process group: graphs.Build)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # the child's cache, and `stored`'s
    settings = static_settings(tiny[1], static_weights="blocks", static_compile="1", batch_size=4, **SMALL)
    worker = (  # stands in for the worker: starts a build, says its pid, waits
        "import json, sys; from batcher.static import graphs; from batcher.settings import StaticSettings; "
        "values = json.loads(sys.argv[1]); values['profile_step_s'] = (); "
        f"build = graphs.Build(StaticSettings(**values), [[1, 64]], busy=lambda: {paused}); "
        "print(build.process.pid, flush=True); sys.stdin.read()"
    )
    shown = json.dumps(dataclasses.asdict(settings))
    parent = subprocess.Popen([sys.executable, "-c", worker, shown], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    child = int(parent.stdout.readline())
    gone = os.pidfd_open(child)  # readable once the child has ended
    try:
        assert not select.select([gone], [], [], 0)[0]  # it runs while its worker lives
        if paused:
            wait_until(lambda: state(child) == "T", 30, "the build stopped while its worker serves")
        parent.kill()
        parent.wait()
        assert select.select([gone], [], [], 120)[0], f"build child {child} still runs"
    finally:
        os.close(gone)
    assert not graphs.stored(settings, (1, 64))  # ended, not finished


def test_a_prompt_that_extends_the_last_one_prefills_only_what_is_new(runner, monkeypatch):
    """STATIC_PREFIX_CACHE (batcher/static/prefix.py), eager and in both compiled forms: a one-row
    round whose prompt extends the last one's continues its cache, with the whole prefill's tokens;
    a round of two rows in between drops it."""
    monkeypatch.setattr(runner.prefix, "enabled", True)  # what STATIC_PREFIX_CACHE=1 sets
    monkeypatch.setattr(runner.prefix, "min_prefix", 8)  # prompts here are at most 24 tokens
    ids = runner.tokenize(" ".join(PROMPTS))[:22]
    first, longer = ids[:16], ids

    def once(prompt: list[int]) -> list[int]:
        seq = Sequence(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
        run(runner, [seq])
        return seq.token_ids

    once(first)
    before = runner.prefix.reused
    continued = once(longer)
    assert runner.prefix.reused - before == 16
    run(runner, [Sequence(p, SamplingParams(max_tokens=2)) for p in PROMPTS[:2]])
    once(longer)
    assert runner.prefix.reused - before == 16  # the round of two dropped the kept cache
    monkeypatch.setattr(runner.prefix, "enabled", False)
    assert once(longer) == continued  # prefilled whole: the same greedy tokens


def test_a_compiled_rounds_cache_is_made_while_vllm_compiles_in_its_own_thread(eager_runners):
    """torch's "compiling" flag is process-wide, set for all of a compile (vLLM's, at its start, in
    its thread), and transformers does not mark a static cache's tensors while it is set: a
    compiled round's cache made then has no mark to remove (removing it failed the round)."""
    import torch

    runner = eager_runners["blocks"]
    with torch.compiler._compile_session_context():  # what Dynamo holds around a compile
        cache = static_cache(runner.model, 1, 64, "cpu")
    tensors = [t for layer in cache.layers for t in (layer.keys, layer.values, layer.cumulative_length)]
    assert tensors and not any(hasattr(t, "_dynamo_static_input_type") for t in tensors)


def test_cache_lengths_come_in_a_few_buckets():
    assert [cache_bucket(n, 1024) for n in (1, 64, 65, 200, 1000, 5000)] == [64, 64, 128, 256, 1024, 1024]


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="STATIC_COMPILE"):
        Config(static_compile="yes")
    with pytest.raises(ValueError, match="STATIC_WEIGHTS=blocks computes in fp32"):
        Config(static_weights="blocks", dtype="float16")


def test_graphs_not_stored_are_built_aside_while_rounds_decode_eager_and_a_later_start_loads_them(
    tiny, eager_runners, inductor, tmp_path, caplog
):
    """MODEL=<the GGUF file>, its blocks compiled, no graphs stored (a cache of its own): ready at
    once, decoding eager while a child process builds the first graphs (batcher/static/graphs.py),
    then decoding through them, loaded, not compiled; a round needing a longer cache's graph runs
    eager and has it built the same way. The next start finds them stored: ready once it has
    loaded the first, and the longer one loaded where a round needs it. Every answer the eager
    runner's."""
    # the module's Inductor cache (`inductor`); the model converted into tmp_path: its graph files its own
    settings = {"model": tiny[0], "cache_dir": str(tmp_path), "static_weights": "blocks"}
    settings |= {"max_input_tokens": 24, "max_new_tokens_limit": 104}  # caches of 64 and 128
    short, long = ({"prompts": [PROMPTS[0]], "max_tokens": n} for n in (8, 80))
    expected = {
        n: run(eager_runners["blocks"], [Sequence(PROMPTS[0], SamplingParams(max_tokens=n))])[0][0] for n in (8, 80)
    }

    def generated(app, body) -> str:
        reply = post(app.test_client(), "/generate", body)
        assert reply.status_code == 200, reply.json
        return reply.json["generated_texts"][0]

    for start in ("first", "later"):
        app = create_app(Config(vllm_enabled=False, static_compile="1", **settings))
        try:
            static = app_state(app).engines["static"]
            assert static.wait_ready(900), engine_health(static)
            health = app.test_client().get("/health").json["engines"]["static"]
            if start == "first":  # the child needs seconds to import torch alone: it is still building
                assert health["graphs"].startswith("building 2") and "compiling" not in health["phase_seconds"]
                assert generated(app, short) == expected[8]
                assert static.graphs_settled.wait(900) and static.runner.first_shapes() == sorted(static.runner._graphs)
                assert static.graphs_loaded == 2  # the child's
                assert generated(app, long) == expected[80]  # eager: its graph is asked of a child
                assert (1, 128) not in static.runner._graphs
                assert static.graphs_settled.wait(900) and (1, 128) in static.runner._graphs
            else:
                assert "compiling" not in health["phase_seconds"] and "graphs" not in health
                assert static.runner.first_shapes() == sorted(static.runner._graphs) and static.graphs_loaded == 2
                assert "static engine: warmed up" in caplog.text  # the loaded graphs' first calls, before ready
            assert generated(app, long) == expected[80] and (1, 128) in static.runner._graphs
            assert generated(app, short) == expected[8]
            assert all(graphs.stored(static.settings, shape) for shape in static.runner._graphs)
        finally:
            shutdown(app)


class _Compiles(Runner):
    """The eager runner, claiming that its next round compiles when told to."""

    def __init__(self, base: Runner):
        self.__dict__.update(base.__dict__)
        self.compile_next = False

    def needs_compile(self, inputs, max_tokens):
        return self.compile_next


def test_a_round_that_compiles_waits_for_vllms_step_and_a_plain_round_does_not(eager_runners):
    """A compile patches torch process-wide (fence.py): vLLM must not be mid-step meanwhile."""
    runner = _Compiles(eager_runners["dense"])
    worker = StaticWorker(runner.settings, load_runner=lambda: runner).start()
    assert worker.wait_ready(60)
    stepping, step_over = threading.Event(), threading.Event()

    def vllm_step():
        with fence.model_work():
            stepping.set()
            assert step_over.wait(120)

    step = threading.Thread(target=vllm_step)
    step.start()
    try:
        assert stepping.wait(30)
        plain = Sequence("Hi", SamplingParams(max_tokens=2))
        worker.submit([plain])
        assert plain.done.wait(120) and plain.status == "finished"  # ran while "vLLM" stepped
        runner.compile_next = True
        compiling = Sequence("Hi", SamplingParams(max_tokens=2))
        worker.submit([compiling])
        assert not compiling.entered.wait(1)  # held at the lock, not in the round
    finally:
        step_over.set()
        step.join(60)
    assert compiling.done.wait(120) and compiling.status == "finished"
    worker.stop()
