"""The one model thread of static batching: take a batch, run one round, resolve, forever.

Request threads call `submit()` and wait on each sequence's `done` event; only this thread
touches the model. A round takes what is waiting *now* (up to `batch_size`), whichever request
it came from, so request boundaries do not matter: (A,B) and (C,D,E) run as [A,B,C,D] and [E].
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable

from batcher import failpoints, fence
from batcher.engine import EngineThread
from batcher.errors import RoundFailed, RowFailed, ShuttingDown
from batcher.metrics import Metrics
from batcher.predict import StaticCost
from batcher.sequence import Sequence
from batcher.settings import StaticSettings
from batcher.static import graphs
from batcher.static.isolation import RowFailures
from batcher.static.runner import Runner, set_torch_threads
from batcher.static.shapes import Shape

log = logging.getLogger(__name__)

# How long a round that begins with a batch line waits for more (the batch runner's lines arrive
# one request thread at a time): a round is seconds long, so a full one is worth this much
BATCH_FILL_S = 0.05
GRAPHS_POLL_S = 1.0  # while a child builds the graphs, an idle engine looks whether it is done this often


class StaticWorker(EngineThread):
    name = "static"

    def __init__(
        self,
        settings: StaticSettings,
        *,
        metrics: Metrics | None = None,
        load_runner: Callable[[], Runner] | None = None,
        serving: Callable[[], int] = lambda: 0,
    ):
        """`load_runner`: builds the runner in the model thread (tests hand in one they built);
        `serving`: the requests this process's other engine holds (a build aside waits on both)."""
        super().__init__(settings, max_queue=settings.max_queue, metrics=metrics)
        self._load_runner = load_runner or functools.partial(Runner, settings)
        self.batch_size, self.batch_wait_s = settings.batch_size, settings.batch_wait_ms / 1000
        self.cost = StaticCost(self.batch_size, self.batch_wait_s, prior=settings.profile_step_s)
        self.torch_threads = settings.torch_threads
        self.metrics.queue_depth.set_function(self.workload.qsize)
        self.metrics.inflight.set_function(self.inflight)
        self.settings, self.runner = settings, None
        self.busy = lambda: self.inflight() + serving() > 0  # graphs.Build: it builds only while idle
        # the blocks' graphs built aside (graphs.py): the child building some, the shapes rounds
        # asked for since, those a child failed to build (eager for good), and whether none is pending
        self.graphs: graphs.Build | None = None
        self.graphs_wanted: set[Shape] = set()
        self.graphs_failed: set[Shape] = set()
        self.graphs_settled = threading.Event()
        self.graphs_loaded = 0  # stored graphs loaded (built aside)
        self.rounds = 0

    def details(self) -> dict:
        building = {}
        if self.graphs is not None:
            building["graphs"] = (
                f"building {len(self.graphs.shapes)} in a child process, then loading; rounds needing them decode eager"
            )
        return {"rounds": self.rounds, **building}

    def kv_cache(self) -> tuple[float, None, None]:
        """Defined honestly: no paged cache, only the rows of one round (a left-padded batch of at
        most BATCH_SIZE, with STATIC_COMPILE a cache of exactly BATCH_SIZE rows), so "in use" is
        the rows taken over the rows a round holds. A full round reads 1.0, as a full vLLM cache
        does: a newcomer waits for the next round. No blocks."""
        return min(1.0, self.running() / self.batch_size), None, None

    # --- the model thread ----------------------------------------------------------------
    def _load(self) -> None:
        failpoints.hit("static.load")
        # transformers sets torch's default dtype while it builds the model, as vLLM does: fenced
        with fence.static_round():
            self.runner = self._load_runner()
        self.vocab_size = self.runner.model.config.vocab_size
        if self.runner.compiles and graphs.builds_aside(self.settings):
            self.runner.may_compile = self._may_compile  # graphs.py: never a compile on a round's path
            missing = [shape for shape in self.runner.first_shapes() if not self._load_graph(shape)]
            if missing:  # ready at once, eager, while a child builds them
                self.graphs = graphs.Build(self.settings, missing, self.busy)
                return
        elif self.runner.compiles:  # STATIC_COMPILE on a GPU: the first graphs, before any request waits
            self._enter_phase("compiling")
        self._warm_up(self.runner.first_shapes())

    def _warm_up(self, shapes: list[Shape]) -> None:
        """A short round of each shape, its graph compiled if need be: no request pays a first call."""
        set_torch_threads(self.torch_threads)
        from torch._dynamo.utils import counters

        kinds = ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")
        before = [counters["inductor"][kind] for kind in kinds]  # process-wide: vLLM's count too
        with fence.model_work() if self.phase == "compiling" else contextlib.nullcontext(), fence.static_round():
            seconds = self.runner.warm_up(shapes)
        loaded, compiled, bypassed = (counters["inductor"][kind] - n for kind, n in zip(kinds, before, strict=True))
        log.info("static engine: warmed up in %.1fs (Inductor graphs: %d loaded from its cache, %d compiled"
                 " and stored, %d compiled uncacheable)", seconds, loaded, compiled, bypassed)  # fmt: skip

    def _load_graph(self, shape: Shape) -> bool:
        """A stored graph handed to the runner (graphs.load), whether there was one. Not fenced:
        loading traces nothing and runs no model."""
        step = graphs.load(self.settings, shape)
        if step is not None:
            self.runner.use_graph(shape, step)
            self.graphs_loaded += 1
        return step is not None

    def _may_compile(self, shape: Shape) -> bool:
        """The runner's gate (model thread): a stored graph is loaded where a round needs it; one
        not stored is asked of a child process, and the round decodes eager meanwhile."""
        if self._load_graph(shape):
            return True
        if shape not in self.graphs_failed:
            self.graphs_wanted.add(shape)
            self.graphs_settled.clear()  # before this round's rows finish: a build is pending
        return False

    def _tend_graphs(self) -> None:
        """Between rounds: a finished build's graphs loaded (a failed one's shapes stay eager, logged),
        and a new build for the shapes rounds asked for since."""
        if self.graphs is not None:
            built, shapes = self.graphs.done(), self.graphs.shapes
            if built is None:
                return
            try:  # /health shows the build until they are loaded
                failed = [shape for shape in shapes if not (built and self._load_graph(shape))]
            finally:
                self.graphs = None
            if failed:
                self.graphs_failed.update(failed)
                log.error("static engine: graphs %s were not built or cannot be loaded; they stay eager", failed)
        wanted = sorted(s for s in self.graphs_wanted if not graphs.stored(self.settings, s))
        self.graphs_wanted.clear()
        if wanted:
            self.graphs = graphs.Build(self.settings, wanted, self.busy)
            self.graphs_settled.clear()
        else:
            self.graphs_settled.set()

    def _serve(self) -> None:
        while not self.lifecycle.stopping.is_set():
            if self.graphs is not None or self.graphs_wanted:
                self._tend_graphs()
            idle = GRAPHS_POLL_S if self.graphs is not None or self.graphs_wanted else None
            batch = self.workload.next_batch(self.batch_size, self.batch_wait_s, idle, fill_s=BATCH_FILL_S)
            if batch and self.lifecycle.stopping.is_set():  # taken while stop() was abandoning
                self._abandon()
            if batch:
                failpoints.hit("static.round")
                self._run_round(batch)
                self._progressed()
            self._note_if_drained()
        if self.graphs is not None:  # a build cut short: the next start builds them again
            self.graphs.stop()
        self._fail_waiting("the static engine shut down before this prompt ran")

    def _abandon(self) -> None:
        # what is taken: the running round stops at its next step; a batch still waiting for
        # latecomers (BATCH_WAIT_MS) runs one step and stops
        for seq in self.workload.taken():
            seq.cancel()

    def _run_round(self, batch: list[Sequence]) -> None:
        self.rounds += 1
        round_no, started = self.rounds, time.perf_counter()
        shape, reasons, error, compiling = None, None, None, False
        # Every round: an idle vLLM engine in this process may have changed torch's thread count.
        set_torch_threads(self.torch_threads)
        failures, ids = RowFailures(), {}
        for row, seq in enumerate(batch):  # per row: a prompt that cannot be tokenized fails alone
            with failures.guard(row, "tokenization"):
                ids[row] = self.runner.tokenize(seq.prompt)
        running = [seq for row, seq in enumerate(batch) if row in ids]
        row_errors = {batch[row].id: exc for row, exc in failures.errors.items()}
        try:
            if running:
                inputs = self.runner.pad([ids[row] for row in sorted(ids)])
                shape = inputs["input_ids"].shape  # [B, S]
                reasons, compiling = self._generate(round_no, running, inputs, row_errors)
        except Exception as exc:  # one bad round fails its own sequences; the thread lives on
            error = exc
            log.exception("round %d failed", round_no)
        elapsed = time.perf_counter() - started
        if error is None and running and not compiling and not row_errors:  # a compile is a one-off
            self._measure(running)
        # logged before anyone is woken, so a client that got its answer finds the line written
        log.info("round %d: Batch input shape: %s sequences=%s %.3fs", round_no, shape, [s.id for s in batch], elapsed)
        for seq in batch:  # before waking any request: nothing in flight is left over
            self.workload.release(seq)
        results = dict(zip((s.id for s in running), reasons or (), strict=False))
        for seq in batch:  # each sequence holds its text: it finishes itself
            if seq.id in row_errors:
                exc = row_errors[seq.id]
                seq.fail(RowFailed(f"this prompt failed in round {round_no}: {type(exc).__name__}: {exc}"))
            elif error is not None:
                seq.fail(RoundFailed(f"round {round_no} failed: {type(error).__name__}: {error}"))
            elif results[seq.id] == "cancelled" and self.lifecycle.stopping.is_set():
                self.lifecycle.abandon()
                seq.fail(ShuttingDown("the static engine shut down while this prompt ran"))
            else:
                seq.finish(results[seq.id])
                self._finished(seq)
            self.metrics.generated_tokens.labels(self.name).inc(len(seq.token_ids))
        self.metrics.rounds.labels("failed" if error else "ok").inc()
        self.metrics.batch_size.observe(len(batch))
        self.metrics.round_seconds.observe(elapsed)

    def _generate(self, round_no: int, seqs: list[Sequence], inputs: dict, row_errors: dict) -> tuple[list[str], bool]:
        """The round's model work on the rows that tokenized: (reasons, whether it compiled). A
        row that fails on its own is added to `row_errors` (by sequence id)."""
        shape = inputs["input_ids"].shape  # [B, S]
        # a round that compiles keeps vLLM from stepping meanwhile (fence.py), a rare event
        compiling = self.runner.needs_compile(inputs, max(s.params.max_tokens for s in seqs))
        failures = RowFailures()
        with fence.model_work() if compiling else contextlib.nullcontext(), fence.static_round():
            mask = inputs["attention_mask"]
            padding = int(mask.numel() - mask.sum())  # the round's pad tokens, every row's
            for seq in seqs:
                seq.start(round_no, len(seqs), tuple(shape), padding=padding)
            reasons = self.runner.generate(seqs, inputs, failures)
        if len(reasons) != len(seqs):
            raise RuntimeError(f"round returned {len(reasons)} results for {len(seqs)} sequences")
        row_errors.update({seqs[row].id: exc for row, exc in failures.errors.items() if row < len(seqs)})
        return reasons, compiling

    def _measure(self, batch: list[Sequence]) -> None:
        """Feed the cost model with the round just run (its rows' own clocks, from the moment
        they entered it to the first token and to the end)."""
        began = min(seq.started_at for seq in batch)
        firsts = [seq.first_token_at for seq in batch if seq.first_token_at is not None]
        if not firsts:
            return
        steps, seconds = max(len(seq.token_ids) for seq in batch), time.monotonic() - began
        prefill = min(firsts) - began
        log.debug("round measured: %d rows, prefill %.3fs, %d steps, %.3fs", len(batch), prefill, steps, seconds)
        self.cost.observe(len(batch), prefill, steps, seconds)
