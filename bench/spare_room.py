"""A batch takes only an engine's spare room: the same interactive load (a few clients, each
sending streamed chat requests one after another) on one engine, alone and with a batch running
behind it; each stream's time to its first token, and the refusals (429) in each."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import requests

from bench import measure
from bench.batch_api import BASES, CHAT, wait_ended, wait_while

CLIENTS, PER_CLIENT = 3, 8  # the interactive load: CLIENTS threads, each PER_CLIENT streams in turn
STARTED_S = 600  # how long a batch may stay `validating` before its lines run


def first_token(url: str, engine: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat request: its status and the seconds to its first content; the stream is
    read to its end (a client that hangs up cancels its row, which is not the load meant)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, **measure.SAME_WORK}  # fmt: skip
    started, ttft = time.perf_counter(), None
    with requests.post(f"{url}{BASES[engine]}/chat/completions", json=body, stream=True,
                       timeout=measure.TIMEOUT_S) as resp:  # fmt: skip
        if resp.status_code != 200:
            return {"status": resp.status_code}
        for line in resp.iter_lines():
            if ttft is None and _has_content(line):
                ttft = time.perf_counter() - started
    return {"status": 200, "ttft_s": ttft}


def _has_content(line: bytes) -> bool:
    """A chunk with text: the role's opening chunk and the usage chunk carry none."""
    if not line.startswith(b"data: {"):
        return False
    choices = json.loads(line[len(b"data: ") :]).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


def interactive(url: str, engine: str, max_tokens: int) -> list[dict]:
    """The load: CLIENTS threads, each PER_CLIENT distinct prompts one after another."""
    prompts = measure.make_prompts(CLIENTS * PER_CLIENT)

    def one_client(k: int) -> list[dict]:
        return [first_token(url, engine, p, max_tokens) for p in prompts[k * PER_CLIENT : (k + 1) * PER_CLIENT]]

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [result for results in pool.map(one_client, range(CLIENTS)) for result in results]


def warm(url: str, engine: str, max_tokens: int) -> None:
    """A stream alone, then one of the load's width: an engine's first steps are slower."""
    first_token(url, engine, "Hello", max_tokens)
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(lambda p: first_token(url, engine, p, max_tokens), measure.make_prompts(CLIENTS)))


def p50_ms(results: list[dict]) -> int | None:
    ttft = [r["ttft_s"] for r in results if r.get("ttft_s") is not None]
    return round(1000 * statistics.median(ttft)) if ttft else None


def compare(url: str, engine: str, sdk: openai.OpenAI, content: bytes, max_tokens: int) -> dict:
    """The load alone; then a batch of `content` created and, once its lines run, the load again;
    the batch cancelled after (and waited for), so that the engine is idle for what follows."""
    alone = interactive(url, engine, max_tokens)
    uploaded = sdk.files.create(file=("batch.jsonl", content), purpose="batch")
    batch = sdk.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    batch = wait_while(sdk, batch.id, {"validating"}, STARTED_S)
    if batch.status != "in_progress":
        raise RuntimeError(f"batch {batch.id} on {engine}: {batch.status}, errors {batch.errors}")
    done_before = batch.request_counts.completed + batch.request_counts.failed
    behind = interactive(url, engine, max_tokens)
    during = sdk.batches.retrieve(batch.id)
    sdk.batches.cancel(batch.id)
    wait_ended(sdk, batch.id)
    p50_alone, p50_behind = p50_ms(alone), p50_ms(behind)
    out = {
        "engine": engine,
        "interactive streams": f"{CLIENTS} clients x {PER_CLIENT}, {max_tokens} tokens",
        "TTFT p50 alone (ms)": p50_alone,
        "TTFT p50 with a batch (ms)": p50_behind,
        "with/alone": round(p50_behind / p50_alone, 2) if p50_alone and p50_behind else None,
        "429 alone": sum(r["status"] == 429 for r in alone),
        "429 with a batch": sum(r["status"] == 429 for r in behind),
        "other failures": sum(r["status"] not in (200, 429) for r in alone + behind),
        "batch lines done meanwhile": during.request_counts.completed + during.request_counts.failed - done_before,
        "batch running at the end": during.status == "in_progress",
    }
    print(f"  {out}", flush=True)
    return out
