"""Predicted wait: each engine's cost model, from live state over what the machine profile measured.

The engine thread measures what it runs and feeds a `WidthClock` (batcher/width_clock.py: a
running median of seconds per batch width, over the profile's figures as a prior); request
threads read the clocks and the workload to predict, for a request of N prompts of M tokens,
when its first prompt starts (queue), when its first token comes (TTFT) and when its last prompt
ends (total):

- static: the rounds ahead of it (the rest of the running round, then what is queued and its own
  prompts, packed BATCH_SIZE at a time as `Workload.next_batch` packs them), each costing
  prefill(w) + (m - 1) * step(w) for its width w and its longest max_tokens m;
- vLLM: a slot (max_num_seqs) frees when a running sequence has made its max_tokens; the
  sequences waiting take the freed slots first come first served, each holding its slot for its
  own max_tokens steps; a step costs step(w) at the engine's width w, and the step that admits a
  sequence prefills it, prefill(w). Both are timed as whole turns of the engine thread's loop
  (adding the new requests, the step, handing out its tokens), which is what a newcomer waits for.

What is queued counts only what runs before the request: batch lines queued run after an
interactive one (batcher/admission.py `ahead`). Rows that stop early (EOS, a stop string) make
both a little pessimistic. Until a clock has a measurement or a prior, the prediction is unknown
(None), never a made-up constant.

How far to trust them is `batcher/calibration.py`'s. One writer per clock (its engine's
thread): each write replaces the mapping, so a reader takes one immutable snapshot and never
sees a half-updated one.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from batcher.width_clock import MAX_AGE_S, WINDOW, WidthClock

__all__ = ["MAX_AGE_S", "UNMEASURED_ROUNDS", "WINDOW", "Prediction", "StaticCost", "VLLMCost", "WidthClock", "Work"]

# static rounds an engine with nothing fresh measured holds (running, then queued): a burst of a few
# requests after a quiet spell (the e2e suite sends 11 sequences at once) fits, a flood does not
UNMEASURED_ROUNDS = 4

# (batch width, seconds a token) as the machine profile measured the engine's form: the clocks'
# prior (batcher/profile/prior.py); () without a profile
Prior = Iterable[tuple[int, float]]


@dataclass(frozen=True)
class Work:
    """What the cost model needs of one sequence."""

    max_tokens: int
    solo: bool = False
    produced: int = 0  # tokens so far (running ones)
    started_at: float | None = None  # time.monotonic() when its round or step began
    priority: int = 0  # batcher/sequence.py Priority: lower goes first (interactive 0, batch lines after)


@dataclass(frozen=True)
class Prediction:
    """Seconds from now; None: unknown (nothing measured yet). `ahead`: sequences queued or
    running before it. `ttft_p90_s`: the first token by then in about nine cases of ten (the
    calibration's 90th percentile; what admission holds against a deadline). `retry_s`: when a
    retry could be admitted, where that is not when the work ahead is done (`queue_s`)."""

    queue_s: float | None
    ttft_s: float | None
    total_s: float | None
    ahead: int
    ttft_p90_s: float | None = None
    retry_s: float | None = None

    @property
    def known(self) -> bool:
        return self.ttft_s is not None

    @property
    def retry_after_s(self) -> int:
        """When a retry could be admitted, rounded up: by default when the work ahead of it should
        be done (its predicted queue time)."""
        return max(1, math.ceil((self.queue_s or 0.0) if self.retry_s is None else self.retry_s))

    def shown(self) -> dict:
        """Milliseconds, as /load, /health and error bodies show it (null: unknown)."""

        def ms(s: float | None):
            return None if s is None else round(s * 1000, 1)

        return {
            "queue_ms": ms(self.queue_s),
            "ttft_ms": ms(self.ttft_s),
            "ttft_p90_ms": ms(self.ttft_p90_s),
            "total_ms": ms(self.total_s),
            "ahead": self.ahead,
        }


class _Clocks:
    """What both cost models share: a prefill clock and a step clock, from one prior."""

    prefill: WidthClock
    step: WidthClock

    def shown(self) -> dict:
        """The clocks in ms by width, and the profile's prior they start from (the same for both)."""
        return {"prefill_ms": self.prefill.shown(), "step_ms": self.step.shown(), "profile_ms": self.step.prior_shown()}

    @property
    def has_prior(self) -> bool:
        return self.step.has_prior

    def forgets_in(self) -> float:
        """Seconds until one of its clocks is back to its prior (or unknown): what a slow spell
        taught it no longer counts (0: neither measured anything)."""
        spans = (clock.forgets_in() for clock in (self.prefill, self.step))
        return min((s for s in spans if s is not None), default=0.0)


class StaticCost(_Clocks):
    """A round of width w, m steps: prefill(w) + (m - 1) * step(w)."""

    def __init__(self, batch_size: int, wait_s: float, now: Callable[[], float] = time.monotonic, prior: Prior = ()):
        self.batch_size, self.wait_s = batch_size, wait_s
        self.prefill, self.step = WidthClock(now, prior), WidthClock(now, prior)

    def observe(self, width: int, prefill_s: float, steps: int, seconds: float) -> None:
        """A round ran: `prefill_s` until its first token, `steps` tokens in its longest row,
        `seconds` in all (the engine thread)."""
        self.prefill.observe(width, prefill_s)
        if steps > 1:
            self.step.observe(width, max(0.0, seconds - prefill_s) / (steps - 1))

    def unmeasured_room(self, running: int, queued: int) -> int:
        """Sequences more it takes while its prediction is unknown (nothing fresh measured): the
        round running and UNMEASURED_ROUNDS - 1 full rounds behind it. A count, as TGI sheds by
        count: what waits behind it is a few rounds however long rounds take, and the first of
        them measures the clocks."""
        return UNMEASURED_ROUNDS * self.batch_size - running - queued

    def _round_s(self, width: int, steps: int, fastest: bool = False) -> float | None:
        prefill, step = self.prefill.at(width, fastest=fastest), self.step.at(width, fastest=fastest)
        if prefill is None or (step is None and steps > 1):
            return None
        return prefill + (steps - 1) * (step or 0.0)

    def _running_s(self, running: Seq[Work], now: float) -> float | None:
        """What is left of the round taken now (0 if none)."""
        if not running:
            return 0.0
        width, steps = len(running), max(w.max_tokens for w in running)
        produced = max(w.produced for w in running)
        started = min((w.started_at for w in running if w.started_at is not None), default=None)
        step = self.step.at(width)
        if started is None or produced == 0:  # not begun (held, or waiting for latecomers), or prefilling
            whole = self._round_s(width, steps)
            spent = 0.0 if started is None else now - started
            return None if whole is None else max(0.0, whole - spent)
        return None if step is None else (steps - produced) * step

    def _rounds(self, work: Seq[Work]) -> list[list[int]]:
        """Indices of `work`, packed into rounds as next_batch packs them."""
        rounds: list[list[int]] = []
        for i, w in enumerate(work):
            last = rounds[-1] if rounds else None
            if last is None or len(last) >= self.batch_size or w.solo or work[last[0]].solo:
                rounds.append([i])
            else:
                last.append(i)
        return rounds

    def predict(self, running: Seq[Work], queued: Seq[Work], new: Seq[Work], fastest: bool = False) -> Prediction:
        """`fastest`: each width at the faster of its clock and its prior (WidthClock.at)."""
        ahead = len(running) + len(queued)
        t = self._running_s(running, time.monotonic())
        if t is None or not new:
            return Prediction(None, None, None, ahead)
        work, first = [*queued, *new], len(queued)
        queue_s = ttft = None
        for indices in self._rounds(work):
            width, steps = len(indices), max(work[i].max_tokens for i in indices)
            begins = t + (0.0 if width >= self.batch_size or work[indices[0]].solo else self.wait_s)
            cost, prefill = self._round_s(width, steps, fastest), self.prefill.at(width, fastest=fastest)
            if cost is None or prefill is None:
                return Prediction(None, None, None, ahead)
            t = begins + cost
            if queue_s is None and indices[-1] >= first:
                queue_s, ttft = begins, begins + prefill
        return Prediction(queue_s, ttft, t, ahead)


class VLLMCost(_Clocks):
    """Steps of the engine at width w: step(w) to decode, prefill(w) for a step that admits."""

    def __init__(self, max_num_seqs: int, now: Callable[[], float] = time.monotonic, prior: Prior = ()):
        self.max_num_seqs = max_num_seqs
        self.prefill, self.step = WidthClock(now, prior), WidthClock(now, prior)

    def observe(self, width: int, seconds: float, *, admitted: bool) -> None:
        """One engine step of `width` sequences; `admitted`: new ones joined at it."""
        (self.prefill if admitted else self.step).observe(width, seconds)

    def unmeasured_room(self, running: int, queued: int) -> int:
        """Sequences more it takes while its prediction is unknown: what joins at the next step,
        with no queue (the steps that run them measure the width)."""
        return self.max_num_seqs - running - queued

    def predict(self, running: Seq[Work], queued: Seq[Work], new: Seq[Work], fastest: bool = False) -> Prediction:
        """`fastest`: each width at the faster of its clock and its prior (WidthClock.at)."""
        ahead = len(running) + len(queued)
        width = min(self.max_num_seqs, ahead + len(new))
        step, prefill = self.step.at(width, fastest=fastest), self.prefill.at(width, fastest=fastest)
        if not new or prefill is None or (step is None and (running or max(w.max_tokens for w in new) > 1)):
            return Prediction(None, None, None, ahead)
        step = step or 0.0
        # each slot's step at which it is free, running ones after their remaining tokens
        slots = [max(0, w.max_tokens - w.produced) for w in running]
        slots += [0] * max(0, self.max_num_seqs - len(slots))
        heapq.heapify(slots)
        joins = []
        for w in [*queued, *new]:
            begins = heapq.heappop(slots)
            heapq.heappush(slots, begins + w.max_tokens)
            joins.append(begins)
        mine = list(zip(joins[len(queued) :], new, strict=True))
        # with something running, a new sequence first waits out the step in progress: half of one
        # on average (the engine thread admits between steps)
        behind = step / 2 if running else 0.0
        queue_s = behind + min(begins for begins, _ in mine) * step
        total = behind + max(begins * step + prefill + (w.max_tokens - 1) * step for begins, w in mine)
        return Prediction(queue_s, queue_s + prefill, total, ahead)
