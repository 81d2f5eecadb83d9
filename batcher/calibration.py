"""Calibration: how the cost model's last predictions came out, and the bound that puts on the next.

What the model leaves out (the request thread's own work before and after the engine, the GIL
shared with the engine thread, a load that changed since the clocks last ran) shows in how its
last predictions came out: `Calibration` keeps measured / predicted time to first token of the
last CALIBRATION_WINDOW sequences, and `ttft_p90_s` is the prediction times that ratio's 90th
percentile: by then about nine in ten first tokens have come. The headers and /load show the
cost model's own prediction; admission holds `ttft_p90_s` against a deadline.
"""

from __future__ import annotations

import dataclasses
import math

from batcher.predict import Prediction

CALIBRATION_WINDOW = 32  # sequences whose measured / predicted TTFT bounds the next predictions
CALIBRATION_MIN = 8  # fewer than this: no bound beyond the prediction itself (ratio 1)


class Calibration:
    """Measured / predicted time to first token of the last CALIBRATION_WINDOW sequences, and
    the bound it puts on a prediction. One writer (the engine thread, as each sequence
    finishes), an immutable tuple for readers, as in WidthClock."""

    def __init__(self) -> None:
        self._ratios: tuple[float, ...] = ()

    def observe(self, predicted_s: float | None, measured_s: float | None) -> None:
        """The engine thread only: a sequence's cost-model TTFT and the one it had."""
        if predicted_s and measured_s:  # both known and above 0
            self._ratios = (*self._ratios[-(CALIBRATION_WINDOW - 1) :], measured_s / predicted_s)

    def factor(self, q: float) -> float:
        """The q-quantile of the ratios (nearest rank); 1 until CALIBRATION_MIN are measured."""
        ratios = sorted(self._ratios)
        if len(ratios) < CALIBRATION_MIN:
            return 1.0
        return ratios[max(0, math.ceil(q * len(ratios)) - 1)]

    def apply(self, model: Prediction) -> Prediction:
        """The cost model's prediction with its 90th-percentile bound."""
        if not model.known:
            return model
        return dataclasses.replace(model, ttft_p90_s=model.ttft_s * self.factor(0.9))

    def shown(self) -> dict:
        return {"sequences": len(self._ratios), "p50": round(self.factor(0.5), 3), "p90": round(self.factor(0.9), 3)}
