"""Prometheus metrics of both engines, on a registry the app owns (one per app, so tests can
build many apps in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # static batching
        self.queue_depth = Gauge("batcher_queue_depth", "Sequences waiting in the static queue", registry=r)
        self.inflight = Gauge("batcher_inflight_sequences", "Static sequences queued or running", registry=r)
        self.rounds = Counter("batcher_rounds", "Static batching rounds run", ["outcome"], registry=r)
        self.batch_size = Histogram(
            "batcher_batch_size", "Sequences per static round", buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r
        )
        self.round_seconds = Histogram(
            "batcher_round_seconds", "Duration of one static round", buckets=_SECONDS, registry=r
        )
        # both engines
        self.request_seconds = Histogram(
            "request_latency_seconds", "HTTP request latency", ["endpoint", "status"], buckets=_SECONDS, registry=r
        )
        self.prompts = Counter("prompts", "Prompts received", ["engine"], registry=r)
        self.generated_tokens = Counter("generated_tokens", "Tokens generated", ["engine"], registry=r)
        # continuous batching
        self.vllm_running = Gauge("vllm_running_requests", "Requests in the vLLM engine", registry=r)
        self.vllm_waiting = Gauge("vllm_waiting_requests", "Requests in the vLLM inbox, not yet added", registry=r)
        self.vllm_steps = Counter("vllm_engine_steps", "vLLM engine steps", registry=r)
