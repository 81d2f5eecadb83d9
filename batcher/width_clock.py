"""Seconds by batch width: what an engine's thread measured lately, over what the machine profile
measured (a prior), from which the cost models (batcher/predict.py) price a step or a round."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

WINDOW = 5  # measurements kept per width
# seconds a measurement counts for: long enough to span a few of the longest rounds (512 tokens at
# ~0.1 s a step) and the gaps of a bursty load, short enough that a slow spell (a CPU hog, the
# other engine's compile) is forgotten two minutes after its end even if nothing is admitted
# meanwhile (an idle engine also prices at the faster of its clock and its prior: batcher/engine.py)
MAX_AGE_S = 120.0


class WidthClock:
    """Seconds by batch width: the low median of the last WINDOW measurements at each width, of
    those younger than MAX_AGE_S.
    A median, not a running mean, because a process's first rounds at a new shape can be many
    times slower than the rest (allocator and kernel set-up, a starved CPU): one such outlier is
    outvoted by the next normal round (the low median of two is the smaller), and the estimate
    still follows a change of load within WINDOW // 2 + 1 rounds.
    Samples age: only admitted work measures, so a clock that a busy spell taught slow steps would
    otherwise refuse the work that could correct it, for good (a 429 on an idle engine). A width
    whose samples have all aged out is unmeasured again.
    `prior`: seconds by width that the machine profile measured (batcher/profile/prior.py), for
    the widths with no fresh sample: a fresh process prices its first load as this machine ran
    it, not as unknown, and never forgets it; a fresh sample at a width replaces it there.
    A width with neither gets an upper bound, never a narrower width's price,
    which under a flood priced width 64 at width 1's and admitted work that then timed out (504):
    the nearest wider width known (a step never gets cheaper with more rows), else the nearest
    narrower one scaled by the ratio of widths (a row never costs more in a wider step: weights
    are read once per step whatever its width; docs/operations.md#admission-cannot-lock-itself-shut).
    Pessimistic until the width runs, and then measured. With no fresh sample and no prior it is
    unknown (None). `now`: the clock (a seam for tests)."""

    def __init__(self, now: Callable[[], float] = time.monotonic, prior: Iterable[tuple[int, float]] = ()) -> None:
        self._now = now
        self._prior: Mapping[int, float] = MappingProxyType(dict(prior))
        # width -> ((when, seconds), ...), oldest first
        self._by_width: MappingProxyType[int, tuple[tuple[float, float], ...]] = MappingProxyType({})

    @property
    def has_prior(self) -> bool:
        return bool(self._prior)

    def observe(self, width: int, seconds: float) -> None:
        """The engine thread only."""
        by_width = dict(self._by_width)
        by_width[width] = (*by_width.get(width, ())[-(WINDOW - 1) :], (self._now(), seconds))
        self._by_width = MappingProxyType(by_width)

    def _fresh(self) -> dict[int, list[float]]:
        """The samples younger than MAX_AGE_S, by width (widths with none left out)."""
        oldest = self._now() - MAX_AGE_S
        fresh = {w: [s for when, s in samples if when >= oldest] for w, samples in self._by_width.items()}
        return {w: samples for w, samples in fresh.items() if samples}

    def at(self, width: int, *, fastest: bool = False) -> float | None:
        """The estimate at `width` (fresh samples over the prior), else its bound from the nearest
        width known, else None. `fastest`: the faster of that and the prior's alone, for an idle
        engine, which may doubt what a slow spell taught its clock, not the machine's own speed."""
        fresh = {w: statistics.median_low(samples) for w, samples in self._fresh().items()}
        estimate = _bound({**self._prior, **fresh}, width)
        if fastest and self._prior:
            return min(estimate, _bound(self._prior, width))
        return estimate

    def forgets_in(self) -> float | None:
        """Seconds until its last sample ages out and it is back to its prior (or unknown); None:
        nothing measured."""
        whens = [when for samples in self._by_width.values() for when, _ in samples]
        return max(0.0, max(whens) + MAX_AGE_S - self._now()) if whens else None

    def shown(self) -> dict[str, float]:
        return {str(w): round(statistics.median_low(s) * 1000, 2) for w, s in sorted(self._fresh().items())}

    def prior_shown(self) -> dict[str, float]:
        return {str(w): round(s * 1000, 2) for w, s in sorted(self._prior.items())}


def _bound(by_width: Mapping[int, float], width: int) -> float | None:
    """The seconds at the nearest width at or above `width`, else the widest's scaled up; None if empty."""
    if not by_width:
        return None
    wider = [w for w in by_width if w >= width]
    if wider:
        return by_width[min(wider)]
    narrower = max(by_width)
    return by_width[narrower] * width / narrower
