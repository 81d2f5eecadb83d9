"""A conversation's later turns against its first: milliseconds to the first token of turn 1 and
of turn TURNS of one conversation continued by `previous_response_id` (the Responses API,
streamed, greedy), per engine. Each turn's prompt holds the whole conversation so far, read from
the store: what the engine makes of that history (recomputed, or found in a prefix cache) is
what the ratio shows."""

from __future__ import annotations

import json
import time

import requests

from bench.measure import TIMEOUT_S

BASES = {"static": "/static/v1", "vllm": "/v1"}
TURNS = 10
QUESTIONS = [
    "What is the capital of France?", "And of Germany?", "Which one is larger?", "Name a river in each.",
    "Which river is longer?", "Name a famous bridge on it.", "When was it built?", "Who designed it?",
    "Name another work of theirs.", "Summarise our talk in one sentence.",
]  # fmt: skip
MAX_TOKENS = 20


def turn(url: str, engine: str, question: str, previous: str | None) -> tuple[float, str, int]:
    """One streamed turn: seconds to its first text (or call) delta, its id, its input tokens."""
    body = {"input": question, "max_output_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    if previous is not None:
        body["previous_response_id"] = previous
    started, first, done = time.perf_counter(), None, None
    with requests.post(f"{url}{BASES[engine]}/responses", json=body, stream=True, timeout=TIMEOUT_S) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"POST /responses -> {resp.status_code}: {resp.text[:300]}")
        for line in resp.iter_lines():
            event = json.loads(line[6:]) if line.startswith(b"data: ") else {}
            if first is None and event.get("type", "").endswith(".delta"):
                first = time.perf_counter() - started
            if event.get("type") in ("response.completed", "response.incomplete"):
                done = event["response"]
    if first is None or done is None:
        raise RuntimeError(f"turn {question!r} on {engine}: the stream ended without text or its last event")
    return first, done["id"], done["usage"]["input_tokens"]


def ratio(url: str, engine: str) -> dict:
    """One warm-up turn (another question: a kept prefix would make turn 1 look warm), then a
    conversation of TURNS turns."""
    turn(url, engine, "Say hello.", None)
    previous, firsts, tokens = None, [], []
    for question in QUESTIONS[:TURNS]:
        first, previous, counted = turn(url, engine, question, previous)
        firsts.append(first)
        tokens.append(counted)
    last = f"turn {TURNS}"
    return {
        "engine": engine,
        "turn 1 (ms)": round(1000 * firsts[0]),
        f"{last} (ms)": round(1000 * firsts[-1]),
        f"{last} / turn 1": round(firsts[-1] / firsts[0], 2),
        "input tokens, turn 1": tokens[0],
        f"input tokens, {last}": tokens[-1],
    }
