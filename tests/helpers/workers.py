"""The static engine's pieces on the real model, with test hooks: a runner whose rounds a test can
hold or fail, sequences submitted to a model thread and waited for. Importing it imports torch."""

from __future__ import annotations

import threading

from batcher.sampling import SamplingParams
from batcher.sequence import Sequence
from batcher.settings import StaticSettings
from batcher.static.runner import Runner
from service.config import Config

POISON = "<fail this round>"
GATE = "<hold this round>"

PROMPTS = [
    "The capital of France is",
    "Hi",
    "Water boils at a temperature of",
    "In the beginning of the story, the young farmer decided to",
]


def static_settings(model_path: str, **config) -> StaticSettings:
    """The static engine's settings as the service resolves them, from Config's defaults and
    `config` (Config's field names)."""
    return Config(**config).static_engine(model_path)


class InstrumentedRunner(Runner):
    """The real runner with two test hooks around the real generate(): a round holding POISON
    raises (fault injection), a round holding GATE waits for `gate` (to make a round last)."""

    def __init__(self, base: Runner):
        self.__dict__.update(base.__dict__)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def generate(self, seqs, inputs, failures=None, **how):
        prompts = [s.prompt for s in seqs]
        if POISON in prompts:
            raise RuntimeError("injected failure")
        if GATE in prompts:
            self.entered.set()
            assert self.gate.wait(60)
        return super().generate(seqs, inputs, failures, **how)


def run(runner, seqs):
    """(text, finish reason) per sequence: the text each received, the reason the round returned."""
    reasons = runner.generate(seqs, runner.encode([s.prompt for s in seqs]))
    return [(s.text, reason) for s, reason in zip(seqs, reasons, strict=True)]


def submit(worker, *prompts, max_tokens=5, solo=False, ignore_eos=False):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
    seqs = [Sequence(p, params, solo=solo) for p in prompts]
    worker.submit(seqs)
    return seqs


def wait(seqs, timeout=60):
    for s in seqs:
        assert s.done.wait(timeout), f"{s.id} not resolved"
