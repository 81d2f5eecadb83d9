"""Admission keeps both its promises on the real app (issue 50, point 8): an idle engine refuses at
once what cannot finish within REQUEST_TIMEOUT_S (a 400 where this machine's profile says no retry
can, a 429 until the clocks forget where only they say so), and a fresh engine prices from the
profile, so a burst of ordinary requests is admitted before it has measured anything. The cost
models fed by hand: tests/unit/test_recovery.py."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from batcher.profile import store
from service.http.state import app_state
from tests.helpers import wait_until
from tests.helpers.apps import post, prompts_counted, static_app

# The static engine's fp32 eager row as `make setup` measured it (Intel Xeon, 2 cores): seconds for
# one call of 1 and 4 prompts of 20 tokens, so 35 and 44 ms a token
SPEED = {"1": 0.69, "4": 0.872}


def write_profile(folder, model_path: str) -> None:
    """A profile for this machine's key in `folder`, in the shape measure.py writes, through the store."""
    row = {"engine": "static", "dtype": "float32", "eager": True, "status": "measured", "exact": 20, "of": 20}
    row |= {"prefix": 1.0, "france": True, "start_s": 1.0, "compile_s": None, "speed": SPEED}
    profile = {"key": store.machine_key(model_path), "measured_at": "test", "reference": "measured", "rows": [row]}
    store.save(profile, folder)


def profiled_app(tmp_path, model_path: str, profiled: bool, **settings):
    """The static engine alone on the CPU in fp32 eager, with the profile above or none."""
    if profiled:
        write_profile(tmp_path, model_path)
    return static_app(profile_dir=str(tmp_path), dtype="float32", device="cpu", **settings)


@pytest.mark.parametrize("profiled", [True, False])
def test_an_idle_engine_refuses_at_once_what_cannot_finish_in_request_timeout_s(tmp_path, model_path, profiled):
    # issue 50: after one round of 4 x 10 tokens, /load predicted 22.7 s for 64 x 40 under
    # REQUEST_TIMEOUT_S 8, and /generate admitted them (idle) and answered 504 after 8 s. Here 64 x
    # 100 tokens: 1,600 steps, past 8 s on any CPU this runs on.
    with profiled_app(tmp_path, model_path, profiled) as app:
        client = app.test_client()
        assert post(client, "/generate", {"prompts": ["Warm"] * 4, "max_tokens": 10}).status_code == 200
        # lowered only now: a cold first round took 8 s here on a busy CPU
        app_state(app).config = dataclasses.replace(app_state(app).config, request_timeout_s=8)  # its own app
        predicted = client.get("/load?prompts=64&max_tokens=100").json["engines"]["static"]
        assert predicted["total_ms"] > 8000
        counted = prompts_counted(app, "static")
        r = post(client, "/generate", {"prompts": [f"Story {i}" for i in range(64)], "max_tokens": 100})
        assert "REQUEST_TIMEOUT_S (8s)" in r.json["error"], r.json
        if profiled:  # even an idle engine at this machine's measured speed cannot: no retry can
            assert (r.status_code, r.json["type"]) == (400, "request_too_large") and "Retry-After" not in r.headers
        else:  # only the clocks say so, which may remember a slow spell: retry once they forget it
            assert (r.status_code, r.json["type"]) == (429, "wait_too_long") and int(r.headers["Retry-After"]) > 1
        assert prompts_counted(app, "static") == counted  # nothing enqueued
        assert predicted["estimates"]["profile_ms"] == ({"1": 34.5, "4": 43.6} if profiled else {})  # the prior


def test_a_fresh_engine_with_a_profile_admits_an_ordinary_burst_before_it_has_measured_anything(
    tmp_path, model_path, request
):
    # issue 50: across a rolling restart, 16 clients of 1-4 prompts x 6 tokens got 241 of 400
    # answered 429 "has not measured steps at this load yet": a fresh worker took 4 rounds
    with profiled_app(tmp_path, model_path, True) as app:
        engine, sizes = app_state(app).engines["static"], [i % 4 + 1 for i in range(16)]  # 40 prompts
        held_rounds = request.getfixturevalue("held_rounds")  # no round ends, so nothing is measured
        replies: dict[int, object] = {}

        def send(i: int) -> None:
            body = {"prompts": [f"Hello {i} {j}" for j in range(sizes[i])], "max_tokens": 6, "ignore_eos": True}
            replies[i] = post(app.test_client(), "/generate", body)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        refused = lambda: [i for i, r in list(replies.items()) if r.status_code == 429]  # noqa: E731
        wait_until(lambda: engine.inflight() + sum(sizes[i] for i in refused()) == 40, 60, "every request in or out")
        assert refused() == [] and engine.inflight() == 40, [replies[i].json for i in refused()]
        held_rounds()
        for t in threads:
            t.join(120)
        assert sorted(r.status_code for r in replies.values()) == [200] * 16
        assert all(r.headers["x-predicted-wait"] != "unknown" for r in replies.values())
