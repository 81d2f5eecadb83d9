"""RowFailures: a failure that belongs to one row of a static round fails that row alone.

A round is shared, its fate is not (STYLE.md). What is done per row (its tokenization, its grammar
matcher, its logprob records, its stop strings and text) runs inside `guard(row)`: an exception
there is that row's, recorded with it; the row is stopped at the next step (RoundRows) and the
worker fails it with its own error, while the other rows run on to their own ends, as if it had
ended early. What runs on the whole batch (the model's forward, the vectorised processors) is
not guarded: its exception escapes `generate()` and fails the round, as before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)


class RowFailures:
    def __init__(self) -> None:
        self.errors: dict[int, Exception] = {}  # row -> its first error

    def __contains__(self, row: int) -> bool:
        return row in self.errors

    @contextlib.contextmanager
    def guard(self, row: int, what: str) -> Iterator[None]:
        """Run the row's own work; an exception is recorded as the row's (the first one only) and
        does not reach the round."""
        try:
            yield
        except Exception as exc:  # the row's, whatever it is: the round must not share it
            if row not in self.errors:
                log.warning("row %d failed in its %s: %s: %s", row, what, type(exc).__name__, exc, exc_info=True)
                self.errors[row] = exc
