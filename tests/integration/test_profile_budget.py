"""The profile's budget across its candidates, through `measure.measure` on this model's tokenizer
(it picks the fidelity prompts' form from it): each candidate's cap and what starts, with fake
children on a fake clock. The rest of the budget's rules, with no model: tests/unit/test_profile_budget.py."""

from __future__ import annotations

from batcher.profile import choose, measure
from tests.helpers.profile import REFERENCE, Clock


class FakeChildren:
    """session.Children on a fake clock: each candidate costs its `cost` seconds, up to its cap."""

    # the blocks rows free (0 s), so that the budget's arithmetic below is the dense rows'
    costs = {"vllm float32 eager": 40.0, "vllm float16 eager": 100.0, "static blocks eager": 0.0}
    costs |= {"vllm blocks eager": 0.0}

    imports_s = 0.0  # what the children's imports take on the clock

    def __init__(self, log, cache, clock):
        self.clock, self.caps, self.closed = clock, {}, False
        self.base_mib, self.waited = 0, []  # no child started: no imports measured

    def measure(self, engine_, spec, cap_s, deadline):
        settings = spec["settings"]
        eager = settings["enforce_eager"] if engine_ == "vllm" else not settings["compile"]
        label = choose.label({"engine": engine_, "dtype": settings["dtype"], "eager": eager})
        cap_s = min(cap_s, deadline - self.clock.now)
        self.caps[label] = cap_s
        cost = self.costs.get(label, 10.0)
        self.clock.now += min(cost, cap_s)
        if cost > cap_s:
            return {"status": f"timed out after {cap_s:.0f} s (its cap: {cap_s:.0f} s)"}
        ok = {"exact": 20, "of": 20, "prefix": 1.0, "france": True, "france_text": "Paris"}
        runs = [[1.0]] * len(spec["timed"])
        start = 1.0 if eager else 30.0
        return {"status": "measured", "start_s": start, **ok, "runs": runs, "completions": REFERENCE}

    def spawn(self, engines):
        self.engines = engines

    def ready(self, engines, deadline):
        assert self.engines == ["static", "vllm"] and set(engines) <= set(self.engines)
        self.waited.append((engines, deadline))
        self.clock.now += self.imports_s
        self.imports_s = 0.0  # the children import side by side: one wait for both

    def close(self):
        self.closed = True


def fake_children(monkeypatch, imports_s: float = 0.0) -> list[FakeChildren]:
    """measure.measure's clock and children faked; the children made, once it has run."""
    clock, made = Clock(), []
    monkeypatch.setattr(measure, "time", clock)

    def children(log, cache):
        made.append(FakeChildren(log, cache, clock))
        made[-1].imports_s = imports_s
        return made[-1]

    monkeypatch.setattr(measure.session, "Children", children)
    return made


def test_each_candidate_has_its_cap_and_the_budget_decides_what_starts(model_path, tmp_path, monkeypatch):
    made = fake_children(monkeypatch)
    result = measure.measure(model_path, tmp_path / "log", budget_s=150, cache="")
    children, rows = made[0], {choose.label(r): r for r in result["rows"]}
    assert children.closed and result["cap_s"] == 60
    assert children.caps["static float32 eager"] == 150  # the reference: the whole budget
    assert children.caps["vllm float32 eager"] == 140  # vLLM's first (its fallback): what is left
    assert children.caps["static float16 eager"] == 60  # every other: CAP_SHARE of it
    assert children.caps["static blocks eager"] == 60 and rows["static blocks eager"]["status"] == "measured"
    assert children.caps["vllm blocks eager"] == 60 and rows["vllm blocks eager"]["status"] == "measured"
    # 10 + 40 + 10 s, then vLLM fp16 eager is killed at its 60 s cap: 30 s left for the rest
    assert rows["vllm float16 eager"]["status"] == "timed out after 60 s (its cap: 60 s)"
    assert children.caps["static bfloat16 eager"] == 30  # what the budget had left
    assert children.caps["vllm bfloat16 eager"] == 20
    # the eager rows done, vLLM's fastest faithful one compiled, in the 10 s left
    assert children.caps["vllm float32 compiled"] == 10 and rows["vllm float32 compiled"]["status"] == "measured"
    assert rows["static float32 compiled"]["status"] == "timed out: budget spent before it started"
    assert rows["vllm float16 compiled"]["status"].startswith("not run: float16 eager timed out")
    assert rows["vllm float32 eager"]["speed"] == {"1": 1.0, "4": 1.0, "64": 1.0}
    assert choose.resolve(result, "vllm", "auto", None)[:2] == ("float32", True)  # as fast, and starts sooner


def test_the_reference_is_measured_even_when_the_childrens_imports_took_the_budget(model_path, tmp_path, monkeypatch):
    """A small PROFILE_BUDGET on a busy machine: the imports alone outlast it. The reference has
    the whole budget from when its child is ready (every other row is judged against it, and
    without it the profile chooses nothing); nothing else starts."""
    made = fake_children(monkeypatch, imports_s=200.0)
    result = measure.measure(model_path, tmp_path / "log", budget_s=30, cache="")
    children, rows = made[0], {choose.label(r): r for r in result["rows"]}
    assert children.waited[0] == (["static"], measure.IMPORTS_S)  # the reference's child: past the budget
    assert children.waited[1] == (["static", "vllm"], 30)  # the others': the budget's end
    assert children.caps["static float32 eager"] == 30 and result["reference"] == "measured"
    assert rows["vllm float32 eager"]["status"] == "timed out: budget spent before it started"
    assert choose.resolve(result, "static", "auto", None)[:2] == ("float32", True)
