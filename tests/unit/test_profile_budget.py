"""The profile within its budget (batcher/profile): the order of the candidates, what is not run
and why, and a candidate stopped once its fidelity is out of reach or its projected time passes
its cap. Fake engines on a fake clock: the measuring logic, not the model
(tests/integration/test_profile.py runs the real engines; tests/integration/test_profile_budget.py
the budget through measure() with this model's tokenizer)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from batcher.profile import candidate, choose, fidelity, finish, measure, session
from tests.helpers.profile import REFERENCE, Clock

TEXTS = [f"prompt {i}" for i in range(len(REFERENCE))]


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(candidate, "time", clock)
    return clock


def engine(clock: Clock, step_s: float, wrong=(), batch: int = 4, slower: dict | None = None) -> SimpleNamespace:
    """A fake engine: each call costs `step_s` a token on `clock` (`slower`: a call of so many
    prompts costs so many seconds instead); prompts in `wrong` answer off the reference from
    their first token; prompt 0 (France) decodes to Paris when right."""
    calls, sizes = [], []

    def generate(prompts, max_tokens, ignore_eos=True, size=0):
        calls.append(len(prompts))
        sizes.append(size)
        clock.now += (slower or {}).get(len(prompts), step_s * max_tokens)
        index = [TEXTS.index(p) if p in TEXTS else 0 for p in prompts]
        return [[-1] * max_tokens if i in wrong else REFERENCE[i][:max_tokens] for i in index]

    decode = lambda ids: "Paris" if ids == REFERENCE[0] else "Lyon"  # noqa: E731
    fake = dict(generate=generate, decode=decode, batch=batch, calls=calls, sizes=sizes)
    return SimpleNamespace(built={"start_s": 1.0}, **fake)


def spec(cap_s: float, sizes=(1, 4), chunk: int = 4, reference=REFERENCE) -> dict:
    timed = [[TEXTS[0]] * n for n in sizes]
    return dict(
        texts=TEXTS, max_tokens=fidelity.MAX_TOKENS, chunk=chunk, reference=reference, cap_s=cap_s,
        timed=timed, timed_tokens=20, repeats=1,
    )  # fmt: skip


def run(spec: dict, fake) -> tuple[dict, list[dict]]:
    events = []
    candidate.measure(spec, lambda _spec: fake, events.append)
    return events[-1], events


def test_out_of_reach_once_france_is_wrong_or_the_best_prefix_is_under_the_bar():
    assert fidelity.out_of_reach(REFERENCE, REFERENCE[:4], france=False).startswith("not faithful: France wrong")
    half = [row[:12] + [-1] * 12 for row in REFERENCE[:4]]  # 0.5 each: at best (2 + 16) / 20 = 0.90
    assert fidelity.out_of_reach(REFERENCE, half, france=True) == (
        "not faithful: agreeing prefix at most 0.90 after 4/20 prompts"
    )
    nearly = [row[:23] + [-1] for row in REFERENCE[:4]]  # at best 0.99: it may still make it
    assert fidelity.out_of_reach(REFERENCE, nearly, france=True) is None


def test_a_candidate_wrong_on_france_stops_after_its_first_round_and_is_not_timed(clock):
    fake = engine(clock, 0.1, wrong={0})
    done, events = run(spec(cap_s=60), fake)
    assert isinstance(done.pop("memory_mib"), int)  # what the engine holds, whatever its status
    assert done == {"event": "done", "status": "not faithful: France wrong after 4/20 prompts", "runs": []}
    assert fake.calls == [4]  # one round of fidelity, no speed runs
    assert next(e for e in events if e["event"] == "fidelity")["of"] == 4


def test_a_faithful_candidate_is_timed_at_each_size_after_its_fidelity(clock):
    fake = engine(clock, 0.1)
    done, events = run(spec(cap_s=60), fake)
    assert done["status"] == "measured" and len(done["runs"]) == 2
    assert fake.calls == [4, 4, 4, 4, 4, 1, 4]  # five rounds of fidelity, then 1 and 4 prompts
    progress = [e for e in events if e["event"] == "fidelity"]  # one a round: a killed row keeps how far it got
    assert [e["of"] for e in progress] == [4, 8, 12, 16, 20]
    assert (progress[-1]["exact"], progress[-1]["prefix"], progress[-1]["france"]) == (20, 1.0, True)


def test_an_unfaithful_candidate_is_not_timed_unless_asked(clock):
    wrong = set(range(1, 20, 5))  # 4 of 20 wrong: prefix 0.80, but only known for sure late
    done, _ = run(spec(cap_s=600), engine(clock, 0.1, wrong=wrong))
    assert done["status"].startswith("not faithful: agreeing prefix at most 0.9") and done["runs"] == []
    done, _ = run({**spec(cap_s=600), "speed_always": True, "chunk": 20}, engine(clock, 0.1, wrong=wrong))
    assert done["status"] == "measured" and len(done["runs"]) == 2  # the bench's fidelity phase


def test_a_slow_candidate_stops_on_its_projection_before_its_cap(clock):
    # a round of 24 tokens: 12 s; 4 rounds left (48 s), then 1 and 4 prompts of 20 tokens (6.25 + 10 s)
    fake = engine(clock, 0.5)
    done, _ = run(spec(cap_s=60), fake)
    assert done["status"] == "too slow: projected 76 s, over its cap of 60 s"
    assert fake.calls == [4] and clock.now == pytest.approx(12)  # stopped at 12 s, not at 60
    # the reference is not stopped on a projection: every other row needs it (the parent's kill stays)
    done, _ = run({**spec(cap_s=60, reference=None), "project": False}, engine(clock, 0.5))
    assert done["status"] == "measured"


def test_the_speed_runs_stop_where_the_rest_would_pass_the_cap(clock):
    # vLLM-like (one call): fidelity 2.4 s, then 1, 4 and 64 prompts projected 2, 2 and 6.4 s (12.8 s
    # in all, within the cap); the 4-prompt call takes 12 s: 16.4 s gone, 6.4 s to come
    fake = engine(clock, 0.1, batch=0, slower={4: 12.0})
    done, _ = run(spec(cap_s=20, sizes=(1, 4, 64), chunk=20), fake)
    assert done["status"] == "too slow: projected 23 s, over its cap of 20 s"
    assert len(done["runs"]) == 2 and fake.calls == [20, 1, 4]


def measured(engine_: str, dtype: str, eager: bool, one_prompt_s: float, prefix: float = 1.0) -> dict:
    return {
        "engine": engine_, "dtype": dtype, "eager": eager, "status": "measured", "exact": 20, "of": 20,
        "prefix": prefix, "france": True, "start_s": 1.0, "speed": {"1": one_prompt_s, "4": one_prompt_s},
    }  # fmt: skip


def test_the_order_is_every_eager_row_then_each_engines_best_compiled_one():
    order = measure.candidates()
    assert order[0] == ("static", "float32", True) and len(set(order)) == 16
    todo, rows, taken = list(order), [], []
    # eager rows as they come: vLLM fp16 the fastest faithful, static bf16 the fastest but unfaithful,
    # each engine's GGUF blocks slower than its fp16 here (so compiled after fp16's)
    one_prompt = {("static", "float32"): 0.9, ("vllm", "float32"): 0.8, ("static", "float16"): 0.7}
    one_prompt |= {("static", "blocks"): 0.75, ("vllm", "blocks"): 0.65}
    one_prompt |= {("vllm", "float16"): 0.6, ("static", "bfloat16"): 0.5, ("vllm", "bfloat16"): 0.4}
    while todo:
        candidate = measure.next_candidate(todo, rows)
        todo.remove(candidate)
        taken.append(candidate)
        engine_, dtype, eager = candidate
        faithful = dtype != "bfloat16"
        rows.append(measured(*candidate, one_prompt.get((engine_, dtype), 0.3), prefix=1.0 if faithful else 0.6))
    labels = [choose.label(dict(zip(("engine", "dtype", "eager"), c, strict=True))) for c in taken]
    dense = [f"{e} {d} eager" for d in measure.DTYPES for e in ("static", "vllm")]
    blocks = ["static blocks eager", "vllm blocks eager"]
    assert labels[:8] == dense[:2] + blocks + dense[2:]  # fp32's answers, fewer bytes: early
    # then what can win: each engine's fastest faithful eager row compiled, vLLM's first (every
    # form's graphs are stored on a CPU: the static engine's fp16, faster than its blocks here)
    assert labels[8:10] == ["vllm float16 compiled", "static float16 compiled"]
    rest = {f"{e} {d} compiled" for e in ("static", "vllm") for d in ("float32", "bfloat16", "blocks")}
    assert set(labels[10:]) == rest


def test_what_is_not_run_says_why():
    ref = {"engine": "static", "dtype": "float32", "eager": True, "status": "measured", "prefix": 1.0, "france": True}
    bf16 = {**ref, "dtype": "bfloat16", "status": "not faithful: France wrong after 4/20 prompts", "prefix": 0.6}
    fp16 = {**ref, "dtype": "float16", "status": "timed out after 60 s (its cap: 60 s)"}
    fp16.pop("prefix")
    slow = {**ref, "engine": "vllm", "status": "too slow: projected 86 s, over its cap of 60 s", "of": 20}
    rows = [{**ref, "of": 20}, bf16, fp16, slow]
    # faithful answers, too slow to time within its cap: its compiled row may be faster, and is run
    assert measure.skipped(("vllm", "float32", False), rows, 100) is None
    assert measure.skipped(("static", "bfloat16", False), rows, 100) == "not run: bfloat16 eager was not faithful"
    assert measure.skipped(("static", "float16", False), rows, 100) == (
        "not run: float16 eager timed out after 60 s (its cap: 60 s)"
    )
    assert measure.skipped(("static", "float32", False), rows, 100) is None
    assert measure.skipped(("static", "float32", False), rows, 9) == "timed out: budget spent before it started"
    assert measure.skipped(("vllm", "float32", True), [{**ref, "status": "timed out"}], 100) == "not run: no reference"


class FakeChild:
    """session.Child without a process: ready at once, every candidate done at once."""

    made: list = []

    def __init__(self, engine_, log, cache):
        self.engine, self.ready, self.events, self.closed = engine_, False, [{"event": "ready"}], None
        FakeChild.made.append(self)

    def send(self, spec):
        self.events.append({"event": "done", "status": "measured", "runs": [[1.0]]})

    def event(self, deadline):
        return self.events.pop(0) if self.events else None

    def close(self, kill=False):
        self.closed = "killed" if kill else "closed"


def test_one_process_per_engine_serves_all_its_candidates(monkeypatch):
    FakeChild.made = []
    monkeypatch.setattr(session, "Child", FakeChild)
    children = session.Children(log=None, cache="")
    children.spawn(["static", "vllm"])
    children.ready(["static", "vllm"], deadline=float("inf"))
    for engine_ in ("static", "vllm", "static", "vllm"):
        assert children.measure(engine_, {}, cap_s=60, deadline=float("inf"))["status"] == "measured"
    assert [child.engine for child in FakeChild.made] == ["static", "vllm"]  # never a second one
    children.close()
    assert [child.closed for child in FakeChild.made] == ["closed", "closed"]


def test_a_model_without_a_chat_template_is_measured_through_plain_completions():
    with_template = SimpleNamespace(
        chat_template="{{ messages[0]['content'] }}!",
        apply_chat_template=lambda turn, **kw: turn[0]["content"] + "!",
    )
    texts, form = fidelity.prompt_texts(with_template)
    assert form == "chat" and texts[fidelity.PARIS_INDEX] == fidelity.PARIS_PROMPT + "!"
    texts, form = fidelity.prompt_texts(SimpleNamespace(chat_template=None))
    assert form == "completion" and "no chat template" in fidelity.FORMS[form]
    assert texts[fidelity.PARIS_INDEX] == f"Question: {fidelity.PARIS_PROMPT}\nAnswer:"


def test_france_is_a_bar_only_where_the_reference_says_paris():
    assert fidelity.france_right("Paris.", "Paris.") and not fidelity.france_right("Lyon.", "Paris.")
    assert not fidelity.france_right("Lyon.")  # no reference text: Paris is wanted
    # a reference that does not know Paris (random weights, a small base model): no bar
    assert fidelity.france_right("Lyon.", "the the the")
    assert fidelity.compare(REFERENCE, REFERENCE[:4], "xyz", reference_paris="abc")["france"]


def test_a_reference_without_paris_leaves_agreement_alone_to_judge(clock):
    """Nobody says Paris: a candidate that agrees with the reference is faithful, one that does
    not is stopped by its agreeing prefix, not by France."""
    fake = engine(clock, 0.1)
    fake.decode = lambda ids: "Lyon"
    done, _ = run(spec(cap_s=600), fake)
    assert done["status"] == "measured", done
    fake = engine(clock, 0.1, wrong=set(range(10)))
    fake.decode = lambda ids: "Lyon"
    done, _ = run(spec(cap_s=600), fake)
    assert done["status"].startswith("not faithful: agreeing prefix"), done


def test_without_a_paris_in_the_reference_the_reason_says_france_was_not_judged():
    faithful = {
        "engine": "static", "dtype": "float32", "eager": True, "status": "measured", "exact": 20, "of": 20,
        "prefix": 1.0, "france": True, "france_bar": False, "speed": {"1": 0.1, "4": 0.2},
    }  # fmt: skip
    assert "France n/a (the reference does not say Paris)" in choose.describe(faithful)
    assert "France right" in choose.describe({**faithful, "france_bar": True})


# --- the compiled rows the budget cut short, finished in the background (finish.py)


def timed_out(engine_: str, dtype: str, why: str = "timed out after 80 s (its cap: 80 s)") -> dict:
    return {"engine": engine_, "dtype": dtype, "eager": False, "status": why}


def cut_short() -> dict:
    rows = [
        measured("static", "float32", True, 0.9),
        measured("vllm", "float32", True, 1.1),
        measured("static", "blocks", True, 0.5),
        timed_out("vllm", "float32"),
        timed_out("static", "blocks", "timed out: budget spent before it started"),
        timed_out("static", "float32", "timed out: budget spent before it started"),
    ]
    return {"key": {"k": 1}, "reference": "measured", "measured_at": "then", "rows": rows}


def test_what_is_finished_is_each_engines_best_compiled_row_the_budget_cut_short():
    profile = cut_short()
    assert finish.unfinished(profile) == [("vllm", "float32", False), ("static", "blocks", False)]
    profile["rows"][3] = {**measured("vllm", "float32", False, 0.7)}
    assert finish.unfinished(profile) == [("static", "blocks", False)]  # measured: nothing left for vLLM
    # the static engine's fastest eager row dense now: its compiled form is the one finished
    profile["rows"][0] = measured("static", "float32", True, 0.3)
    assert finish.unfinished(profile) == [("static", "float32", False)]
    assert finish.unfinished({**profile, "finished_at": "failed: ..."}) == []  # once per profile
    assert finish.unfinished({**profile, "reference": "timed out"}) == []
    assert finish.unfinished(None) == []


def test_a_compiled_row_whose_cold_compile_spent_its_cap_is_finished_and_one_slow_without_one_is_not():
    profile = cut_short()
    profile["rows"][3] = {**measured("vllm", "float32", False, 0.7)}
    slow = "too slow: projected 74 s, over its cap of 74 s"
    profile["rows"][4] = {**timed_out("static", "blocks", slow), "compile_s": 58.7, "stored": True}
    assert finish.unfinished(profile) == [("static", "blocks", False)]
    profile["rows"][4] = {
        **timed_out("static", "blocks", slow),
        "compile_s": None,
    }  # its graphs were loaded: it is slow
    assert finish.unfinished(profile) == []


def test_the_finished_rows_replace_the_ones_cut_short_and_the_rest_stay():
    profile, todo = cut_short(), [("vllm", "float32", False), ("static", "blocks", False)]
    again = measured("static", "float32", True, 5.0)  # the reference, measured again beside them: not merged
    fresh = {"rows": [again, measured("vllm", "float32", False, 0.7), measured("static", "blocks", False, 0.4)]}
    merged = finish.merge(profile, fresh, todo, 123.4)
    assert [r["status"] for r in merged["rows"]][3:5] == ["measured", "measured"]
    assert merged["rows"][0] == profile["rows"][0] and merged["rows"][5] == profile["rows"][5]
    assert merged["finished_at"] and merged["finish_wall_s"] == 123 and finish.unfinished(merged) == []
    assert choose.resolve(merged, "vllm", "auto", None)[:2] == ("float32", False)  # auto now sees it


def test_a_finish_runs_once_and_never_beside_another(tmp_path, monkeypatch):
    profile = cut_short()
    key = profile["key"]
    monkeypatch.setattr(finish.store, "machine_key", lambda model_path: key)
    finish.store.save(profile, tmp_path)
    asked = []

    def fake_measure(model_path, log_path, budget_s, only, cache):
        asked.append(only)
        return {"rows": [measured(e, d, x, 0.5) for e, d, x in only]}

    monkeypatch.setattr(finish.measure, "measure", fake_measure)
    held = finish.Lock(finish.lock_path(key, tmp_path))
    assert held.take()
    assert finish.run("model", tmp_path, "", tmp_path / "log") is None and asked == []  # another run holds it
    assert not finish.wait(key, tmp_path, timeout_s=0)
    held.close()
    assert finish.wait(key, tmp_path, timeout_s=30)
    done = finish.run("model", tmp_path, "", tmp_path / "log")
    assert asked == [[("vllm", "float32", False), ("static", "blocks", False)]]
    assert done == finish.store.load(key, tmp_path) and finish.unfinished(done) == []
    assert finish.run("model", tmp_path, "", tmp_path / "log") is None and len(asked) == 1  # once


def test_the_static_fidelity_chunks_run_in_turn_alone_and_as_one_round():
    """Both widths the static engine serves are judged (their fp16 linears read different weight
    formats): the chunks of BATCH_SIZE prompts alternate rounds of 1 and one round of 4."""
    fake = engine(Clock(), 0.01)
    done, _ = run({**spec(cap_s=600), "widths": [1, 4]}, fake)
    assert done["status"] == "measured"
    assert fake.sizes[:5] == [1, 4, 1, 4, 1]  # the five fidelity chunks, then the timed runs


def test_the_blocks_row_is_not_run_for_a_model_with_no_gguf_behind_it():
    ref = {"engine": "static", "dtype": "float32", "eager": True, "status": "measured", "prefix": 1.0, "france": True}
    blocks = ("static", "blocks", True)
    why = measure.skipped(blocks, [ref], 100, gguf=False)
    assert why.startswith("not run: the model was not converted from a GGUF")
    assert measure.skipped(blocks, [ref], 100, gguf=True) is None


def test_the_blocks_fastest_eager_compile_next_and_the_finish_takes_them_up():
    order = measure.candidates()
    rows = [measured("static", "float32", True, 0.9), measured("vllm", "float32", True, 0.8)]
    rows += [measured("static", "blocks", True, 0.4)]
    todo = [c for c in order if c[2] is False]
    assert measure.next_candidate(todo, rows) == ("vllm", "float32", False)
    todo.remove(("vllm", "float32", False))
    assert measure.next_candidate(todo, rows) == ("static", "blocks", False)
    profile = {"reference": "measured", "rows": rows}
    assert ("static", "blocks", False) in finish.unfinished(profile)
