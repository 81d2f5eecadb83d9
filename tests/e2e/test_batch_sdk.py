"""The Files and Batches APIs driven by the pinned `openai` SDK, unmodified, against a real
gunicorn on both base URLs: upload, retrieve, list (every page), content and delete of files;
create, retrieve, list and cancel of batches; each API key's own. The SDK's strict response
validation checks every object's fields and types.

One server of this module's own: its files and batches live under a fresh DATA_DIR, so what a
test lists is what this module made. Both engines ready: a batch under /v1 runs on vLLM, under
/static/v1 on the static engine.
"""

from __future__ import annotations

import json

import openai
import pytest
import requests

from tests.helpers import BASES, MODEL, wait_until
from tests.helpers.servers import KEY, serving

OTHER_KEY = "other-key"
CHAT = "/v1/chat/completions"


def lines(count: int, max_tokens: int = 16) -> bytes:
    """A chat batch file of `count` lines, each its own custom_id."""
    rows = []
    for i in range(count):
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": max_tokens}
        rows.append({"custom_id": f"line-{i}", "method": "POST", "url": CHAT, "body": body})
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch_sdk")
    env = {"API_KEY": f"{OTHER_KEY},{KEY}", "DATA_DIR": str(folder / "data"), "THREADS": "16"}
    with serving(folder, env) as srv:
        yield srv


def client(server, base: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + base, api_key=key, max_retries=0, _strict_response_validation=True)


@BASES
def test_a_file_is_uploaded_retrieved_listed_read_and_deleted(server, base):
    sdk = client(server, base)
    content = lines(3)
    made = sdk.files.create(file=("lines.jsonl", content), purpose="batch")
    assert made.object == "file" and made.purpose == "batch" and made.filename == "lines.jsonl"
    assert made.bytes == len(content) and made.status == "processed"
    assert sdk.files.retrieve(made.id) == made
    assert made.id in [f.id for f in sdk.files.list(purpose="batch")]
    assert sdk.files.content(made.id).content == content
    deleted = sdk.files.delete(made.id)
    assert deleted.id == made.id and deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(made.id)


@BASES
def test_the_sdk_walks_every_page_of_files(server, base):
    sdk = client(server, base)
    mine = {sdk.files.create(file=(f"f{i}.jsonl", lines(1)), purpose="batch").id for i in range(3)}
    first = sdk.files.list(limit=1)
    assert len(first.data) == 1 and first.has_more is True
    walked = [f.id for f in sdk.files.list(limit=1)]  # the SDK follows `after` from page to page
    assert len(walked) == len(set(walked)) and mine <= set(walked)
    assert walked == [f.id for f in sdk.files.list()]


@BASES
def test_a_purpose_other_than_batch_is_refused(server, base):
    with pytest.raises(openai.BadRequestError) as refused:
        client(server, base).files.create(file=("lines.jsonl", lines(1)), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"


@BASES
def test_a_batch_is_created_retrieved_listed_and_cancelled(server, base):
    sdk = client(server, base)
    source = sdk.files.create(file=("lines.jsonl", lines(40, max_tokens=64)), purpose="batch")
    made = sdk.batches.create(
        input_file_id=source.id, endpoint=CHAT, completion_window="24h", metadata={"job": "sdk test"}
    )
    assert made.object == "batch" and made.status == "validating" and made.endpoint == CHAT
    assert made.input_file_id == source.id and made.metadata == {"job": "sdk test"}
    assert sdk.batches.retrieve(made.id).id == made.id
    assert made.id in [b.id for b in sdk.batches.list()]
    cancelled = sdk.batches.cancel(made.id)  # 40 lines of 64 tokens: far from done this soon
    # the runner may end it at once: the cancel's answer is the batch as it is when read back
    assert cancelled.id == made.id and cancelled.status in ("cancelling", "finalizing", "cancelled"), cancelled
    assert cancelled.cancelling_at is not None


@BASES
def test_the_sdk_walks_every_page_of_batches(server, base):
    sdk = client(server, base)
    source = sdk.files.create(file=("lines.jsonl", lines(1)), purpose="batch")
    mine = {sdk.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h").id for _ in range(3)}
    walked = [b.id for b in sdk.batches.list(limit=2)]
    assert len(walked) == len(set(walked)) and mine <= set(walked)


@BASES
def test_a_bad_batch_is_refused_naming_its_field(server, base):
    sdk = client(server, base)
    source = sdk.files.create(file=("lines.jsonl", lines(1)), purpose="batch")
    for fields, param in (
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-nope"}, "input_file_id"),
    ):
        body = {"input_file_id": source.id, "endpoint": CHAT, "completion_window": "24h", **fields}
        with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as refused:
            sdk.batches.create(**body)
        assert refused.value.body["param"] == param, refused.value.body


@BASES
def test_another_keys_files_and_batches_are_not_found(server, base):
    mine, theirs = client(server, base), client(server, base, OTHER_KEY)
    source = mine.files.create(file=("lines.jsonl", lines(1)), purpose="batch")
    batch = mine.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    for call in (
        lambda: theirs.files.retrieve(source.id),
        lambda: theirs.files.content(source.id),
        lambda: theirs.files.delete(source.id),
        lambda: theirs.batches.retrieve(batch.id),
        lambda: theirs.batches.cancel(batch.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert source.id not in [f.id for f in theirs.files.list()]
    assert batch.id not in [b.id for b in theirs.batches.list()]


@BASES
def test_a_batch_runs_to_completion_and_its_output_is_the_online_answer(server, base):
    """Upload, create, poll until completed, fetch: every custom_id once, each answer the online
    route's for the same body (greedy), a bad line in the error file with the route's error JSON."""
    sdk = client(server, base)
    good = [json.loads(row) for row in lines(4, max_tokens=6).decode().splitlines()]
    for row in good:
        row["body"]["temperature"] = 0
    bad = {"custom_id": "bad", "method": "POST", "url": CHAT, "body": {**good[0]["body"], "max_tokens": -1}}
    content = "".join(json.dumps(row) + "\n" for row in [*good, bad]).encode()
    source = sdk.files.create(file=("lines.jsonl", content), purpose="batch")
    batch = sdk.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    counts = []

    def ended() -> bool:
        seen = sdk.batches.retrieve(batch.id)
        counts.append(seen.request_counts.completed if seen.request_counts else 0)
        return seen.status in ("completed", "failed", "expired", "cancelled")

    wait_until(ended, timeout=300, what=f"batch {batch.id} to end", every=0.25)
    done = sdk.batches.retrieve(batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 4, 1)
    assert counts == sorted(counts)  # the counts only grow as lines finish
    output = [json.loads(row) for row in sdk.files.content(done.output_file_id).text.splitlines()]
    errors = [json.loads(row) for row in sdk.files.content(done.error_file_id).text.splitlines()]
    assert sorted(row["custom_id"] for row in output) == sorted(row["custom_id"] for row in good)
    assert [row["custom_id"] for row in errors] == ["bad"]
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {KEY}"
    by_id = {row["custom_id"]: row for row in good}
    for row in output:
        online = http.post(f"{server.url}{base}/chat/completions", json=by_id[row["custom_id"]]["body"]).json()
        answer = row["response"]["body"]
        assert row["response"]["status_code"] == 200 and answer["choices"] == online["choices"], (answer, online)
        assert answer["usage"] == online["usage"] and answer["object"] == online["object"]
    refused = http.post(f"{server.url}{base}/chat/completions", json=bad["body"])
    assert errors[0]["response"] == {**errors[0]["response"], "status_code": 400, "body": refused.json()}
