"""The bench's client of the service's Files and Batches API, through the pinned `openai` SDK:
a batch file's bytes, one upload and batch per call, and its status read until it ends."""

from __future__ import annotations

import json
import time

import openai

from bench import measure

CHAT = "/v1/chat/completions"
BASES = {"vllm": "/v1", "static": "/static/v1"}  # the engine a batch runs on, by its base URL
UNENDED = {"validating", "in_progress", "finalizing", "cancelling"}  # OpenAI's states before the end
POLL_S = 0.25  # how often a batch's status is read
BATCH_TIMEOUT_S = 4 * 3600


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def client(url: str, engine: str) -> openai.OpenAI:
    """The SDK on one engine's base URL (a service without an API key); no retries, so that a
    refusal is seen."""
    return openai.OpenAI(base_url=url + BASES[engine], api_key="unused", max_retries=0, timeout=measure.TIMEOUT_S)


def submit(sdk: openai.OpenAI, content: bytes) -> tuple[float, str]:
    """Upload the file and create its batch: (when the batch was created, its id)."""
    uploaded = sdk.files.create(file=("batch.jsonl", content), purpose="batch")
    started = time.perf_counter()
    return started, sdk.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h").id


def wait_while(sdk: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = BATCH_TIMEOUT_S):
    """The batch once its status is none of `statuses` (read every POLL_S); raises at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (batch := sdk.batches.retrieve(batch_id)).status in statuses:
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id}: still {batch.status} after {timeout_s:g} s")
        time.sleep(POLL_S)
    return batch


def wait_ended(sdk: openai.OpenAI, batch_id: str, timeout_s: float = BATCH_TIMEOUT_S):
    return wait_while(sdk, batch_id, UNENDED, timeout_s)
