"""One request of the soak's mix: the routes, the body each takes, and its outcome (answered,
refused with a reason, or lost), as the soak's table counts them."""

from __future__ import annotations

import json
import time

import requests

from bench import measure

CHAT = "/chat/completions"
ROUTES = {  # engine -> (path, stream) for each route of the mix
    "vllm": [("/generate_vllm", False), ("/generate_vllm_stream", True), ("/v1/completions", False),
             ("/v1/completions", True), ("/v1" + CHAT, False), ("/v1" + CHAT, True)],
    "static": [("/generate", False), ("/generate_stream", True), ("/static/v1/completions", False),
               ("/static/v1/completions", True), ("/static/v1" + CHAT, False), ("/static/v1" + CHAT, True)],
}  # fmt: skip


def body(path: str, stream: bool, prompt: str, max_tokens: int) -> dict:
    """The soak's one request shape: one short prompt, exactly `max_tokens` tokens."""
    same = {"max_tokens": max_tokens, **measure.SAME_WORK}
    if path.endswith(CHAT):
        return {"messages": [{"role": "user", "content": prompt}], "stream": stream, **same}
    if "/v1/" in path:
        return {"prompt": prompt, "stream": stream, **same}
    return {"prompt": prompt, **same} if stream else {"prompts": [prompt], **same}


def reason(payload: object) -> tuple[str, str] | None:
    """(code, message) of an error body in either shape the service writes, None without one."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):  # OpenAI's: our own type is its "code"
        code, text = err.get("code") or err.get("type"), err.get("message")
    else:  # the demo routes': {"error": message, "type": code}
        code, text = payload.get("type") if isinstance(err, str) else None, err
    return (str(code), str(text)) if code and text else None


def _stream(resp: requests.Response, deadline: float) -> tuple[str, str]:
    """A 200 stream read to its end: ("200", "") or the error event it carried instead."""
    for line in resp.iter_lines():
        if time.monotonic() > deadline:  # requests' timeout is per read; a trickle never trips it
            return "LOST: client timeout", "stream still going"
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            return "200", ""
        event = json.loads(data)
        if "error" in event:
            why = reason(event)
            return (f"200, then {why[0]} in the stream", why[1]) if why else ("FAIL: stream error, no reason", "")
        if event.get("done"):
            return "200", ""
    return "LOST: stream cut", "no final event"


def send(url: str, path: str, stream: bool, payload: dict, timeout_s: float) -> tuple[str, str]:
    """One request: its outcome (a key of the table) and an example message."""
    try:
        with requests.post(url + path, json=payload, timeout=timeout_s, stream=stream) as resp:
            if resp.status_code == 200:
                return _stream(resp, time.monotonic() + timeout_s) if stream else ("200", "")
            if resp.status_code not in (429, 503, 504):
                return f"LOST: {resp.status_code}", resp.text[:200]
            try:
                why = reason(resp.json())
            except ValueError:  # a proxy's HTML page, say
                why = None
            if why is None:
                return f"FAIL: {resp.status_code} without a reason", resp.text[:200]
            if resp.status_code != 504 and not resp.headers.get("Retry-After"):
                return f"FAIL: {resp.status_code} {why[0]} without Retry-After", why[1]
            return f"{resp.status_code} {why[0]}", why[1]
    except requests.Timeout:
        return "LOST: client timeout", f"no answer in {timeout_s:.0f} s"
    except (requests.RequestException, ValueError) as exc:  # refused, reset, a body cut mid-read
        return "LOST: connection error", f"{type(exc).__name__}: {str(exc)[:150]}"
