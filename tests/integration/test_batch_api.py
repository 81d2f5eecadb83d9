"""The Files and Batches APIs' HTTP side on both base URLs, through Flask's test client: every
route, every 4xx, each key's own files and batches, and the cursor pages.

The app is the real one (`create_app`, every hook), built without starting a thread: no engine
serves and no runner moves a batch, so what a test reads is what the routes wrote, and the
routes show they answer whatever the engine's state (they are storage). Running batches is
service/jobs/'s (its own tests)."""

from __future__ import annotations

import io
import json
import tracemalloc

import pytest
from sqlalchemy import event

from service import create_app
from service.config import Config
from service.http.state import app_state
from service.jobs.store import owner_of
from tests.helpers import BASES

KEYS = ("k1", "k2")
MAX_FILE_BYTES = 2 << 20  # over the 1 MiB body bound (MAX_BODY_BYTES), which an upload is not held to
LINE = {
    "custom_id": "a",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"messages": [{"role": "user", "content": "Hi"}]},
}
JSONL = (json.dumps(LINE) + "\n").encode()
CHAT = "/v1/chat/completions"
FORM = "multipart/form-data"  # as the SDK and curl -F send it, with a file part or without


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("jobs")
    config = Config(api_key=",".join(KEYS), data_dir=str(data_dir), max_file_bytes=MAX_FILE_BYTES)
    return create_app(config, start=False)  # no thread: the engines stay `loading`, no runner turns


@pytest.fixture
def client(app):
    return app.test_client()


def auth(key: str = "k1") -> dict:
    return {"Authorization": f"Bearer {key}"}


def upload(client, base: str, content: bytes = JSONL, key: str = "k1", **form):
    data = {"purpose": "batch", "file": (io.BytesIO(content), "lines.jsonl"), **form}
    return client.post(f"{base}/files", data=data, headers=auth(key))


def uploaded(client, base: str, content: bytes = JSONL, key: str = "k1") -> dict:
    r = upload(client, base, content, key)
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.json


def create(client, base: str, key: str = "k1", **fields):
    body = {"endpoint": CHAT, "completion_window": "24h", **fields}
    if "input_file_id" not in body:
        body["input_file_id"] = uploaded(client, base, key=key)["id"]
    return client.post(f"{base}/batches", json=body, headers=auth(key))


def created(client, base: str, key: str = "k1", **fields) -> dict:
    r = create(client, base, key, **fields)
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.json


def refused(r, status: int, param: str | None, *words: str) -> None:
    """`r` is OpenAI's error, naming `param` and saying each of `words`."""
    assert r.status_code == status, (r.status_code, r.get_data(as_text=True))
    error = r.json["error"]
    assert error["param"] == param, error
    for word in words:
        assert word in error["message"], error


# --- files ---------------------------------------------------------------------------------------
@BASES
def test_a_file_is_uploaded_listed_read_and_deleted(client, base):
    made = uploaded(client, base)
    assert made["object"] == "file" and made["id"].startswith("file-")
    assert made["purpose"] == "batch" and made["filename"] == "lines.jsonl" and made["bytes"] == len(JSONL)
    assert made["status"] == "processed" and isinstance(made["created_at"], int)
    fid = made["id"]
    assert client.get(f"{base}/files/{fid}", headers=auth()).json == made
    listed = client.get(f"{base}/files", headers=auth()).json
    assert listed["object"] == "list" and made in listed["data"] and listed["has_more"] is False
    r = client.get(f"{base}/files/{fid}/content", headers=auth())
    assert r.status_code == 200 and r.data == JSONL and r.mimetype == "application/octet-stream"
    assert client.delete(f"{base}/files/{fid}", headers=auth()).json == {"id": fid, "object": "file", "deleted": True}
    for method, path in (("get", fid), ("get", f"{fid}/content"), ("delete", fid)):
        refused(getattr(client, method)(f"{base}/files/{path}", headers=auth()), 404, None, fid)
    assert made not in client.get(f"{base}/files", headers=auth()).json["data"]


def test_files_are_one_store_for_both_base_urls(client):
    made = uploaded(client, "/v1")
    assert client.get(f"/static/v1/files/{made['id']}", headers=auth()).json == made


@BASES
def test_an_upload_past_the_json_body_bound_is_taken_up_to_max_file_bytes(client, base):
    """MAX_BODY_BYTES (1 MiB) bounds JSON bodies; a file is bounded by MAX_FILE_BYTES alone."""
    content = b"x" * MAX_FILE_BYTES
    made = uploaded(client, base, content)
    assert made["bytes"] == MAX_FILE_BYTES
    assert client.get(f"{base}/files/{made['id']}/content", headers=auth()).data == content


@BASES
@pytest.mark.parametrize("size", [MAX_FILE_BYTES + 1, 2 * MAX_FILE_BYTES], ids=["one byte over", "body over"])
def test_a_file_over_max_file_bytes_is_a_400_naming_the_bound_and_keeps_nothing(client, base, size):
    before = client.get(f"{base}/files", headers=auth()).json["data"]
    refused(upload(client, base, b"x" * size), 400, "file", "MAX_FILE_BYTES", str(MAX_FILE_BYTES))
    assert client.get(f"{base}/files", headers=auth()).json["data"] == before


@BASES
@pytest.mark.parametrize("purpose", ["fine-tune", "assistants", "batch_output", ""])
def test_a_purpose_other_than_batch_is_a_400_naming_it(client, base, purpose):
    refused(upload(client, base, purpose=purpose), 400, "purpose", "batch")


@BASES
def test_an_upload_without_purpose_or_file_is_a_400_naming_it(client, base):
    r = client.post(f"{base}/files", data={"file": (io.BytesIO(JSONL), "lines.jsonl")}, headers=auth())
    refused(r, 400, "purpose", "required")
    r = client.post(f"{base}/files", data={"purpose": "batch"}, content_type=FORM, headers=auth())
    refused(r, 400, "file", "required")
    # curl's -F file=lines.jsonl (no @) sends the name as text, not the file
    r = client.post(
        f"{base}/files", data={"purpose": "batch", "file": "lines.jsonl"}, content_type=FORM, headers=auth()
    )
    refused(r, 400, "file", "file part")


@BASES
def test_an_upload_with_a_field_it_does_not_take_is_a_400_naming_it(client, base):
    refused(upload(client, base, expires_after="3600"), 400, "expires_after", "expires_after")
    extra = {"other": (io.BytesIO(b"{}"), "other.jsonl")}
    refused(upload(client, base, **extra), 400, "other", "other")


@BASES
def test_an_upload_from_another_origins_page_is_a_403_and_keeps_nothing(client, base):
    """A page on another site can make a browser post a form here without asking (no preflight)."""
    before = client.get(f"{base}/files", headers=auth()).json["data"]
    data = {"purpose": "batch", "file": (io.BytesIO(JSONL), "lines.jsonl")}
    r = client.post(f"{base}/files", data=data, headers={**auth(), "Origin": "https://elsewhere.example"})
    refused(r, 403, None, "another origin")
    assert client.get(f"{base}/files", headers=auth()).json["data"] == before
    same = {"purpose": "batch", "file": (io.BytesIO(JSONL), "lines.jsonl")}
    assert client.post(f"{base}/files", data=same, headers={**auth(), "Origin": "http://localhost"}).status_code == 200


@BASES
def test_an_upload_not_sent_as_a_form_is_a_415(client, base):
    r = client.post(f"{base}/files", json={"purpose": "batch", "file": "..."}, headers=auth())
    refused(r, 415, None, "multipart/form-data")


@BASES
@pytest.mark.parametrize(
    "query, param",
    [
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=many", "limit"),
        ("order=up", "order"),
        ("color=red", "color"),
    ],
)
def test_a_bad_files_query_is_a_400_naming_it(client, base, query, param):
    refused(client.get(f"{base}/files?{query}", headers=auth()), 400, param, param)


@BASES
def test_files_page_by_after_in_either_order(client, base):
    mine = {uploaded(client, base)["id"] for _ in range(5)}
    for order in ("desc", "asc"):
        whole = client.get(f"{base}/files?order={order}", headers=auth()).json
        assert whole["has_more"] is False and mine <= {f["id"] for f in whole["data"]}
        walked, after = [], ""
        while True:
            page = client.get(f"{base}/files?order={order}&limit=2{after}", headers=auth()).json
            assert page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"]
            walked += page["data"]
            if not page["has_more"]:
                break
            assert len(page["data"]) == 2
            after = f"&after={page['last_id']}"
        assert walked == whole["data"]
    ascending = client.get(f"{base}/files?order=asc", headers=auth()).json["data"]
    assert ascending == client.get(f"{base}/files", headers=auth()).json["data"][::-1]
    outputs = client.get(f"{base}/files?purpose=batch_output", headers=auth()).json["data"]
    assert {f["purpose"] for f in outputs} <= {"batch_output"} and not mine & {f["id"] for f in outputs}


# --- batches -------------------------------------------------------------------------------------
@BASES
@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_a_batch_is_created_retrieved_listed_and_cancelled(client, base, endpoint):
    source = uploaded(client, base)
    made = created(client, base, input_file_id=source["id"], endpoint=endpoint, metadata={"job": "eval"})
    assert made["object"] == "batch" and made["id"].startswith("batch")
    assert made["status"] == "validating" and made["endpoint"] == endpoint and made["input_file_id"] == source["id"]
    assert made["completion_window"] == "24h" and made["metadata"] == {"job": "eval"}
    assert made["expires_at"] == made["created_at"] + 24 * 3600
    assert made["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert made["output_file_id"] is None and made["error_file_id"] is None and made["errors"] is None
    bid = made["id"]
    assert client.get(f"{base}/batches/{bid}", headers=auth()).json == made
    assert bid in [b["id"] for b in client.get(f"{base}/batches", headers=auth()).json["data"]]
    cancelled = client.post(f"{base}/batches/{bid}/cancel", headers=auth()).json
    assert cancelled["status"] == "cancelling" and cancelled["cancelling_at"] >= made["created_at"]
    assert client.get(f"{base}/batches/{bid}", headers=auth()).json == cancelled


@pytest.mark.parametrize("base, engine", [("/v1", "vllm"), ("/static/v1", "static")])
def test_a_batch_runs_on_the_engine_of_its_base_url(app, client, base, engine):
    made = created(client, base)
    assert app_state(app).store.batch(owner_of("k1"), made["id"]).engine == engine


@BASES
@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"endpoint": "/v1/embeddings"}, "endpoint", ["/v1/chat/completions"]),
        ({"endpoint": None}, "endpoint", []),
        ({"completion_window": "1h"}, "completion_window", ["24h"]),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", ["16"]),
        ({"metadata": {"k" * 65: "v"}}, "metadata", ["64"]),
        ({"metadata": {"k": "v" * 513}}, "metadata", ["512"]),
        ({"metadata": {"k": 1}}, "metadata", []),
        ({"model": "SmolLM2"}, "model", ["unknown field"]),
        ({"output_expires_after": {"anchor": "created_at", "seconds": 3600}}, "output_expires_after", []),
    ],
)
def test_a_bad_batch_field_is_a_400_naming_it(client, base, fields, param, words):
    refused(create(client, base, **fields), 400, param, param, *words)


@BASES
def test_a_batch_without_a_required_field_is_a_400_naming_it(client, base):
    fid = uploaded(client, base)["id"]
    whole = {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h"}
    for field in whole:
        body = {k: v for k, v in whole.items() if k != field}
        refused(client.post(f"{base}/batches", json=body, headers=auth()), 400, field, "required")


@BASES
def test_a_batch_body_not_json_is_refused(client, base):
    refused(client.post(f"{base}/batches", data="{", content_type="application/json", headers=auth()), 400, None)
    refused(client.post(f"{base}/batches", data={"endpoint": CHAT}, headers=auth()), 415, None)


@BASES
def test_a_batch_over_a_file_absent_or_not_for_batches_is_refused_naming_input_file_id(app, client, base):
    refused(create(client, base, input_file_id="file-nope"), 404, "input_file_id", "file-nope")
    output = app_state(app).store.add_file(owner_of("k1"), "batch_output", "out.jsonl", b"{}\n")
    refused(create(client, base, input_file_id=output.id), 400, "input_file_id", "batch_output")


@BASES
def test_an_unknown_batch_is_a_404(client, base):
    refused(client.get(f"{base}/batches/batch-nope", headers=auth()), 404, None, "batch-nope")
    refused(client.post(f"{base}/batches/batch-nope/cancel", headers=auth()), 404, None, "batch-nope")


@BASES
@pytest.mark.parametrize("query, param", [("limit=0", "limit"), ("limit=101", "limit"), ("before=x", "before")])
def test_a_bad_batches_query_is_a_400_naming_it(client, base, query, param):
    refused(client.get(f"{base}/batches?{query}", headers=auth()), 400, param, param)


@BASES
def test_batches_page_newest_first_by_after(client, base):
    mine = {created(client, base)["id"] for _ in range(5)}
    whole = client.get(f"{base}/batches?limit=100", headers=auth()).json
    assert mine <= {b["id"] for b in whole["data"]}
    created_at = [b["created_at"] for b in whole["data"]]
    assert created_at == sorted(created_at, reverse=True)
    walked, after = [], ""
    while True:
        page = client.get(f"{base}/batches?limit=2{after}", headers=auth()).json
        assert page["object"] == "list" and page["last_id"] == page["data"][-1]["id"]
        walked += page["data"]
        if not page["has_more"]:
            break
        after = f"&after={page['last_id']}"
    assert [b["id"] for b in walked] == [b["id"] for b in whole["data"]]
    assert len(client.get(f"{base}/batches", headers=auth()).json["data"]) == min(20, len(whole["data"]))


# --- owners, keys, engines, the cap --------------------------------------------------------------
@BASES
def test_another_keys_files_and_batches_are_absent(client, base):
    fid = uploaded(client, base, key="k1")["id"]
    bid = created(client, base, key="k1", input_file_id=fid)["id"]
    for path in (f"files/{fid}", f"files/{fid}/content", f"batches/{bid}"):
        refused(client.get(f"{base}/{path}", headers=auth("k2")), 404, None)
    refused(client.delete(f"{base}/files/{fid}", headers=auth("k2")), 404, None)
    refused(client.post(f"{base}/batches/{bid}/cancel", headers=auth("k2")), 404, None)
    refused(create(client, base, key="k2", input_file_id=fid), 404, "input_file_id")
    assert fid not in [f["id"] for f in client.get(f"{base}/files", headers=auth("k2")).json["data"]]
    assert bid not in [b["id"] for b in client.get(f"{base}/batches", headers=auth("k2")).json["data"]]
    # and k1's are untouched by k2's tries
    assert client.get(f"{base}/files/{fid}", headers=auth("k1")).status_code == 200
    assert client.get(f"{base}/batches/{bid}", headers=auth("k1")).json["status"] == "validating"


@BASES
@pytest.mark.parametrize(
    "method, path", [("post", "files"), ("get", "files"), ("post", "batches"), ("get", "batches"), ("get", "files/f")]
)
def test_a_missing_or_wrong_key_is_a_401(client, base, method, path):
    for headers in ({}, auth("k3")):
        r = getattr(client, method)(f"{base}/{path}", headers=headers)
        assert r.status_code == 401 and r.json["error"]["type"] == "authentication_error", r.get_data(as_text=True)


@BASES
def test_files_and_batches_answer_while_the_engine_cannot_generate(client, base):
    """No engine started here (both loading): the generate routes answer 503, storage does not."""
    r = client.post(f"{base}/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}, headers=auth())
    assert r.status_code == 503, r.get_data(as_text=True)
    assert created(client, base)["status"] == "validating"
    assert client.get(f"{base}/files", headers=auth()).status_code == 200


@BASES
def test_files_and_batches_are_outside_the_in_flight_cap(app, client, base):
    """A full cap refuses generate requests (429 too_busy), never an upload or a new batch."""
    gate = app_state(app).inflight
    held = [gate.try_enter() for _ in range(gate.limit)]
    try:
        assert gate.try_enter() is None
        r = client.post(f"{base}/completions", json={"prompt": "Hi"}, headers=auth())
        assert r.status_code == 429 and r.json["error"]["code"] == "too_busy", r.get_data(as_text=True)
        bid = created(client, base)["id"]
        assert client.post(f"{base}/batches/{bid}/cancel", headers=auth()).status_code == 200
    finally:
        for slot in held:
            slot.release()


def test_a_full_disk_is_a_507_and_keeps_nothing(tmp_path):
    """SQLite's bound on its pages stands in for a full disk: the upload is refused whole."""
    config = Config(vllm_enabled=False, data_dir=str(tmp_path), max_file_bytes=MAX_FILE_BYTES)
    app = create_app(config, start=False)
    store = app_state(app).store

    @event.listens_for(store.db, "connect")
    def _small(connection, _record) -> None:
        connection.execute("PRAGMA max_page_count = 40")

    store.db.dispose()
    client = app.test_client()
    data = {"purpose": "batch", "file": (io.BytesIO(b"x" * 400_000), "lines.jsonl")}
    r = client.post("/v1/files", data=data)
    assert r.status_code == 507 and r.json["error"]["code"] == "insufficient_storage", r.json
    assert client.get("/v1/files").json["data"] == []


def test_an_upload_and_its_download_hold_a_piece_of_the_file_never_the_whole(tmp_path):
    """werkzeug spools the part to a temporary file; the route writes it to the store a piece at
    a time, and the content route sends it as it reads it."""
    size = 24 << 20
    config = Config(vllm_enabled=False, data_dir=str(tmp_path), max_file_bytes=size)
    client = create_app(config, start=False).test_client()
    boundary = "piecebypiece"
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--{boundary}\r\n'
    head += 'Content-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
    body = head.encode() + b"x" * size + f"\r\n--{boundary}--\r\n".encode()
    tracemalloc.start()
    try:
        r = client.post("/v1/files", data=body, content_type=f"multipart/form-data; boundary={boundary}")
        _, upload_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        reply = client.get(f"/v1/files/{r.json['id']}/content", buffered=False)
        got = sum(len(piece) for piece in reply.response)
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.json["bytes"] == size and got == size and reply.headers["Content-Length"] == str(size)
    assert upload_peak < size // 4 and download_peak < size // 4, (upload_peak, download_peak)


def test_a_batch_for_a_disabled_engine_is_a_503_and_nothing_is_made(tmp_path):
    """It would never run on this replica: refused as the online routes refuse that engine."""
    app = create_app(Config(vllm_enabled=False, data_dir=str(tmp_path)), start=False)
    client = app.test_client()
    source = uploaded(client, "/v1", key=None)
    body = {"input_file_id": source["id"], "endpoint": CHAT, "completion_window": "24h"}
    refused(client.post("/v1/batches", json=body), 503, None, "disabled")
    assert client.get("/v1/batches").json["data"] == []
