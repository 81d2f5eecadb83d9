"""What /metrics shows of the batch jobs, read from the store when scraped: the lines of the
batches that run now by engine and state, and every batch by engine and status. Every series is
there from the start (at 0), so that a dashboard's rate or alert has a series before the first batch."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy.exc import SQLAlchemyError

from service.jobs.lines import Lines
from service.jobs.runner import PREFIXES
from service.jobs.store import Store

log = logging.getLogger(__name__)

ENGINES = tuple(PREFIXES)
LINE_STATES = ("pending", "running", "done_ok", "done_error")  # done_ok: the route answered 200
RUNNING = ("in_progress", "cancelling")  # the batches whose lines batch_lines counts
STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")


class BatchCollector:
    """batch_lines{engine,state} and batches{engine,status}, two grouped queries per scrape."""

    def __init__(self, store: Store):
        self.store, self.lines = store, Lines(store.db)

    def describe(self) -> Iterator[GaugeMetricFamily]:  # the names, without reading the database
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lines, batches = self._families()
        try:
            line_counts, batch_counts = self.lines.census(RUNNING), self.store.census()
        except SQLAlchemyError as exc:  # the database away: the engines' metrics still answer
            log.warning("batch metrics: the store did not answer: %s", exc)
            return
        for engine in ENGINES:
            for state in LINE_STATES:
                lines.add_metric([engine, state], line_counts.get((engine, state), 0))
            for status in STATUSES:
                batches.add_metric([engine, status], batch_counts.get((engine, status), 0))
        yield lines
        yield batches

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "batch_lines",
                "Lines of the batches in progress or cancelling, by engine and state",
                labels=["engine", "state"],
            ),
            GaugeMetricFamily("batches", "Batches by engine and status", labels=["engine", "status"]),
        )
