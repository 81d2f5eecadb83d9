"""What the profile measured of the form an engine runs, as its cost model's prior: seconds a
token at each batch width (batcher/width_clock.py), so that a fresh worker prices its first load
as this machine ran it instead of refusing what it has not measured yet.

A row's `speed` holds, per size n, the seconds one call of n prompts of TIMED_TOKENS tokens took
(measure.py): one round of width n on the static engine (n never exceeds the profile's
BATCH_SIZE), a call whose steps run n wide on vLLM. Spread evenly over its tokens, the prefill's
share rides on every step: a little high for a step, low for a prefill, right for a whole round
of that many tokens. Measured with every core: under a smaller TORCH_THREADS the prior runs fast
until the first rounds replace it.
"""

from __future__ import annotations

from batcher.profile.measure import TIMED_TOKENS


def step_seconds(profile: dict | None, engine: str, dtype: str, eager: bool) -> tuple[tuple[int, float], ...]:
    """(width, seconds a token), narrowest first, from `profile`'s row for `engine` in `dtype`
    and that decoding; () without a profile or a timed row (a form the profile did not time)."""
    rows = (profile or {}).get("rows", [])
    row = next((r for r in rows if (r.get("engine"), r.get("dtype"), r.get("eager")) == (engine, dtype, eager)), None)
    speed = (row or {}).get("speed") or {}
    return tuple(sorted((int(n), seconds / TIMED_TOKENS) for n, seconds in speed.items() if seconds > 0))
