"""Prometheus metrics of both engines, on a registry the app owns (one per app, so tests can
build many apps in one process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# vLLM's default buckets (vllm/v1/metrics/buckets.py), copied: importing vllm costs seconds, and a
# deployment without the vLLM engine never imports it
# fmt: off
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
         80.0, 160.0, 640.0, 2560.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
            960.0, 1920.0, 7680.0)
# fmt: on
_RATIO = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
_VLLM_LABELS = ["model_name", "engine"]  # vLLM's "engine" is an engine index; here static | vllm
# what the Gateway API Inference Extension's endpoint picker reads of vllm:cache_config_info
# (docs/proposals/003-model-server-protocol): the KV cache's block size in tokens and its blocks
_CACHE_INFO_LABELS = [*_VLLM_LABELS, "block_size", "num_gpu_blocks"]

# (fraction of the KV cache in use, tokens per block, blocks); block size and count are None where
# the cache has no blocks (static batching)
CacheState = tuple[float, int | None, int | None]


class KVCacheCollector:
    """vllm:kv_cache_usage_perc and vllm:cache_config_info of each engine, read when scraped (the
    info series only for an engine whose cache has blocks, once it knows them)."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.engines: dict[str, Callable[[], CacheState | None]] = {}

    def describe(self) -> Iterator[GaugeMetricFamily]:  # the names, without reading any engine
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        usage, info = self._families()
        for engine, read in self.engines.items():
            state = read()
            fraction, block_size, blocks = state if state is not None else (0.0, None, None)
            usage.add_metric([self.model_name, engine], fraction)
            if block_size is not None and blocks is not None:  # an info metric: always 1, facts in labels
                info.add_metric([self.model_name, engine, str(block_size), str(blocks)], 1.0)
        yield usage
        yield info

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "vllm:kv_cache_usage_perc",
                "KV cache in use, 0..1 (static: rows taken over BATCH_SIZE)",
                labels=_VLLM_LABELS,
            ),
            GaugeMetricFamily(
                "vllm:cache_config_info", "The KV cache's block size and blocks", labels=_CACHE_INFO_LABELS
            ),
        )


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, model_name: str = ""):
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
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
        # both engines, under the names vLLM's own server uses (vllm/v1/metrics/loggers.py), so
        # that a dashboard made for vLLM reads either engine; counted per sequence
        self.num_running = Gauge(
            "vllm:num_requests_running", "Sequences in a running round or step", _VLLM_LABELS, registry=r
        )
        self.num_waiting = Gauge("vllm:num_requests_waiting", "Sequences queued", _VLLM_LABELS, registry=r)
        self.kv_cache = KVCacheCollector(model_name)
        r.register(self.kv_cache)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens prefilled", _VLLM_LABELS, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", _VLLM_LABELS, registry=r)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "From submission to the first token",
            _VLLM_LABELS,
            buckets=_TTFT,
            registry=r,
        )
        self.inter_token = Histogram(
            "vllm:inter_token_latency_seconds",
            "Between tokens (a sequence's mean interval, once per interval)",
            _VLLM_LABELS,
            buckets=_ITL,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "From submission to the last token",
            _VLLM_LABELS,
            buckets=_LATENCY,
            registry=r,
        )
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "From submission to its round or step",
            _VLLM_LABELS,
            buckets=_LATENCY,
            registry=r,
        )
        # ours: how far the predicted time to first token (batcher/predict.py) was off
        self.prediction_error = Histogram(
            "batcher_ttft_prediction_error_ratio",
            "|predicted - measured| / measured time to first token",
            ["engine"],
            buckets=_RATIO,
            registry=r,
        )

    def watch(
        self,
        engine: str,
        running: Callable[[], int],
        waiting: Callable[[], int],
        kv_cache: Callable[[], CacheState | None],
    ) -> None:
        """The gauges of `engine`, read from its own counts and its KV cache when scraped."""
        self.num_running.labels(self.model_name, engine).set_function(running)
        self.num_waiting.labels(self.model_name, engine).set_function(waiting)
        self.kv_cache.engines[engine] = kv_cache

    def finished(self, engine: str, seq) -> None:
        """A sequence the engine finished (not failed): its latencies, tokens and prediction."""
        labels = (self.model_name, engine)
        self.generation_tokens.labels(*labels).inc(len(seq.token_ids))
        if seq.prompt_tokens:
            self.prompt_tokens.labels(*labels).inc(seq.prompt_tokens)
        if seq.started_at is not None:
            self.queue_time.labels(*labels).observe(seq.started_at - seq.created_at)
        if seq.finished_at is not None:
            self.e2e.labels(*labels).observe(seq.finished_at - seq.created_at)
        ttft = seq.ttft_s
        if ttft is None:
            return
        self.ttft.labels(*labels).observe(ttft)
        intervals = len(seq.token_ids) - 1
        if intervals > 0 and seq.finished_at is not None:
            mean = (seq.finished_at - seq.first_token_at) / intervals
            for _ in range(intervals):
                self.inter_token.labels(*labels).observe(mean)
        if seq.predicted is not None and seq.predicted.known and ttft > 0:
            self.prediction_error.labels(engine).observe(abs(seq.predicted.ttft_s - ttft) / ttft)
