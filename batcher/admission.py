"""Admission's rules, which each engine applies under its lifecycle's lock (batcher/engine.py
`_admission`) to the prediction its cost model makes (batcher/predict.py): a request is admitted
whole or refused at once, never admitted to end in a late 504.

- `within_limits`: the prediction against the client's first-token deadline (X-Max-Queue-Ms) and
  REQUEST_TIMEOUT_S; an unknown prediction admits only the cost model's `unmeasured_room`.
- `fits_alone`: what the engine, idle and at its fastest, could not finish in REQUEST_TIMEOUT_S:
  a 400 where the machine profile backs that price (no retry can succeed), a 429 until the clocks
  forget where only they say so.
- `ahead`: batch work is preemptible. Queued batch lines run after an interactive request
  (batcher/workload.py), so its prediction and its share of the bound leave them out; and only
  interactive work teaches the calibration (engine.py `_finished`): a batch line's prediction is
  no promise, since interactive work that comes after it passes it.
"""

from __future__ import annotations

import dataclasses

from batcher.errors import NeverFits, WaitTooLong
from batcher.predict import Prediction, Work
from batcher.sequence import Priority, Sequence


def work(seq: Sequence) -> Work:
    """What the cost model needs of a sequence."""
    return Work(seq.params.max_tokens, seq.solo, len(seq.token_ids), seq.started_at, seq.priority)


def ahead(queued: list[Sequence], new: list[Work]) -> list[Work]:
    """What of the queue runs before `new`: the live sequences at its priority or a more urgent
    one. Batch work queued before an interactive request runs after it (batcher/workload.py), so
    it neither delays nor refuses it: to an interactive request it is preemptible."""
    urgent = urgency(new)
    return [work(seq) for seq in queued if not seq.cancelled and seq.priority <= urgent]


def urgency(new: list[Work]) -> int:
    """A request's priority (its sequences share one); interactive for none, as /load asks."""
    return min((w.priority for w in new), default=Priority.INTERACTIVE)


def fits_alone(engine: str, alone: Prediction, max_total_s: float | None, profiled: bool, forgets_in: float) -> None:
    """Refuse what would miss `max_total_s` on the engine idle at its fastest (`alone`): with
    the machine profile behind that price no retry can succeed (NeverFits: fewer prompts or
    tokens can); with only clocks, which may remember a slow spell, a 429 until they forget it."""
    if max_total_s is None or not alone.known or alone.total_s <= max_total_s:
        return
    message = f"predicted completion in {alone.total_s:.1f}s on the {engine} engine idle"
    message += f" exceeds REQUEST_TIMEOUT_S ({max_total_s:g}s)"
    if profiled:
        raise NeverFits(f"{message} at the speed this machine's profile measured: ask fewer prompts or tokens")
    raise WaitTooLong(message, prediction=dataclasses.replace(alone, retry_s=forgets_in))


def within_limits(
    engine: str, prediction: Prediction, max_ttft_s: float | None, max_total_s: float | None, room_after: int
) -> None:
    """Refuse (WaitTooLong) what the prediction says misses a limit. Unknown (the clocks have not
    measured this load, or their samples aged out): with a limit, only what fits the cost
    model's `unmeasured_room` is let in, so a flood cannot pile up work nobody can price."""
    if not prediction.known:
        if (max_ttft_s is not None or max_total_s is not None) and room_after < 0:
            message = f"the {engine} engine has not measured steps at this load yet and is full"
            raise WaitTooLong(f"{message} ({prediction.ahead} sequences ahead)", prediction=prediction)
        return
    if max_ttft_s is not None and prediction.ttft_p90_s > max_ttft_s:
        message = f"predicted time to first token {prediction.ttft_p90_s * 1000:.0f} ms (90th percentile)"
        message += f" on the {engine} engine"
        raise WaitTooLong(f"{message} exceeds the deadline of {max_ttft_s * 1000:g} ms", prediction=prediction)
    if max_total_s is not None and prediction.total_s > max_total_s:
        message = f"predicted completion in {prediction.total_s:.1f}s on the {engine} engine"
        raise WaitTooLong(f"{message} exceeds REQUEST_TIMEOUT_S ({max_total_s:g}s)", prediction=prediction)
