"""Batch jobs past one machine (docs/operations.md, "Batch jobs past one machine: PostgreSQL"):
two real gunicorns sharing one PostgreSQL (tests/helpers/postgres.py starts it; skipped, saying
why, where it cannot). A batch made on one is seen on the other, both run its lines, and after a
`kill -9` of the first (master and worker) mid-batch the second hands itself the dead one's
claimed lines once its heartbeat is stale and completes the batch, every custom_id exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator

import pytest
import requests
from sqlalchemy import func, select

from service.jobs import tables
from tests.helpers import wait_until
from tests.helpers.postgres import database, postgres_server
from tests.helpers.servers import serving

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
LINES = 48
# the static engine alone, a round of four on one thread each: the batch lasts long enough for
# both replicas to take part before one of them is killed
ENV = {"VLLM_ENABLED": "0", "BATCH_SIZE": "4", "TORCH_THREADS": "1"}


@contextlib.contextmanager
def replicas(tmp_path, url: str) -> Iterator[list]:
    with contextlib.ExitStack() as stack:
        started = []
        for n in (1, 2):
            folder = tmp_path / f"replica{n}"
            folder.mkdir()
            env = {**ENV, "DATABASE_URL": url}
            started.append(stack.enter_context(serving(folder, env, ready=("static",), disabled=("vllm",))))
        yield started


def done_by_worker(db, batch_id: str) -> dict[str, int]:
    query = (
        select(tables.lines.c.worker, func.count())
        .where(tables.lines.c.batch_id == batch_id, tables.lines.c.state == "done")
        .group_by(tables.lines.c.worker)
    )
    with db.connect() as conn:
        return dict(conn.execute(query).all())


def test_two_replicas_share_a_batch_and_one_survives_the_others_kill(tmp_path):
    with postgres_server() as server, database(server) as url, replicas(tmp_path, url) as (first, second):
        items = [
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {
                    "messages": [{"role": "user", "content": f"Count from {i} to {i + 40}, in words."}],
                    "max_tokens": 24,
                    "temperature": 0,
                },
            }
            for i in range(LINES)
        ]
        content = "".join(json.dumps(item) + "\n" for item in items).encode()
        files = {"file": ("lines.jsonl", content, "application/jsonl")}
        made = requests.post(f"{first.url}/static/v1/files", data={"purpose": "batch"}, files=files, timeout=30)
        assert made.status_code == 200, made.text
        body = {"input_file_id": made.json()["id"], "endpoint": CHAT, "completion_window": "24h"}
        batch = requests.post(f"{first.url}/static/v1/batches", json=body, timeout=30).json()
        seen = requests.get(f"{second.url}/static/v1/batches/{batch['id']}", timeout=30)
        assert seen.status_code == 200 and seen.json()["input_file_id"] == body["input_file_id"], seen.text

        db = tables.connect(url)
        try:

            def both_answered() -> bool:  # and lines are left to run (checked at the kill)
                return len(done_by_worker(db, batch["id"])) >= 2

            wait_until(both_answered, 300, "both replicas to answer a line", every=0.5)
            os.killpg(first.proc.pid, signal.SIGKILL)  # the master, its worker and its probe server
            first.proc.wait(30)
            at_kill = done_by_worker(db, batch["id"])
            assert sum(at_kill.values()) < LINES, f"the batch ended before the kill: {at_kill}"

            def ended() -> dict:
                reply = requests.get(f"{second.url}/static/v1/batches/{batch['id']}", timeout=30).json()
                return reply if reply["status"] in ("completed", "failed", "expired", "cancelled") else {}

            wait_until(ended, 600, "the batch to end on the surviving replica", every=0.5)
            result = ended()
            assert result["status"] == "completed", result
            assert result["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}, result
            output = requests.get(f"{second.url}/static/v1/files/{result['output_file_id']}/content", timeout=30)
            custom_ids = [json.loads(line)["custom_id"] for line in output.text.splitlines()]
            assert sorted(custom_ids) == sorted(item["custom_id"] for item in items)  # every one, once
            after = done_by_worker(db, batch["id"])
            grew = [worker for worker, count in after.items() if count > at_kill.get(worker, 0)]
            assert sum(after.values()) == LINES and len(grew) == 1 and grew[0] in at_kill, (at_kill, after)
        finally:
            db.dispose()
