"""`/v1/files`, served: an upload kept in one transaction as it is read, within MAX_FILE_BYTES
(a cut upload keeps nothing), the listing as OpenAI's cursor page, a file's record, its bytes,
and its deletion. Files are one store for both base URLs, each key's own."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

from flask import Request, Response
from werkzeug.datastructures import FileStorage
from werkzeug.exceptions import RequestEntityTooLarge

from service.errors import ApiError, InvalidRequest, UnknownField, UnsupportedMediaType
from service.jobs.file_bytes import CHUNK_BYTES
from service.jobs.store import FileRecord, Store
from service.openai.files.protocol import FileList, Upload
from service.openai.storage import NotFound, page

MAX_FILENAME = 255  # characters: a file system's bound on a name
BATCH_FILE = "the JSONL file of requests"


class CrossOrigin(ApiError):
    status, type = 403, "cross_origin"


def read_form(request: Request, max_file_bytes: int) -> tuple[dict[str, str], FileStorage]:
    """The form's text fields and its `file` part, from a `multipart/form-data` body whose
    `max_content_length` is set (Config.max_upload_bytes) before this reads it.

    A browser sends a multipart form to any origin without asking first (no CORS preflight), so a
    web page could fill this service's disk from a visitor's browser: an upload whose `Origin` is
    another site is a 403 before its body is read (the SDK and curl send no Origin)."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise CrossOrigin(f"an upload from a web page of another origin ({origin}) is refused")
    if request.mimetype != "multipart/form-data":
        sent = request.mimetype or "no Content-Type"
        raise UnsupportedMediaType(
            f"a file is uploaded as 'multipart/form-data' (fields 'file' and 'purpose'), not {sent}"
        )
    try:
        fields, parts = request.form.to_dict(), request.files
    except RequestEntityTooLarge:
        raise too_large(max_file_bytes) from None
    if "file" in fields:
        raise InvalidRequest(f"'file' must be a file part, {BATCH_FILE} (curl: -F file=@lines.jsonl)", param="file")
    others = sorted(set(parts) - {"file"})
    if others:
        raise UnknownField(f"unknown file part '{others[0]}': the upload takes 'file' and 'purpose'", param=others[0])
    if "file" not in parts:
        raise InvalidRequest(f"'file' is required: {BATCH_FILE}, as the form's file part 'file'", param="file")
    return fields, parts["file"]


def too_large(max_file_bytes: int) -> InvalidRequest:
    return InvalidRequest(f"'file' is larger than MAX_FILE_BYTES ({max_file_bytes} bytes)", param="file")


def upload(store: Store, owner: str, form: Upload, file: FileStorage, max_file_bytes: int) -> dict:
    """The file kept whole, or nothing kept: a part past the bound ends the transaction its pieces
    were written in."""
    filename = file.filename or "upload.jsonl"
    if len(filename) > MAX_FILENAME:
        raise InvalidRequest(f"'file': its name is longer than {MAX_FILENAME} characters", param="file")
    if "\x00" in filename:  # no text column holds it (PostgreSQL refuses it)
        raise InvalidRequest("'file': its name must not hold a NUL character", param="file")
    return store.add_file(owner, form.purpose, filename, _pieces(file, max_file_bytes)).to_openai()


def _pieces(file: FileStorage, max_file_bytes: int) -> Iterator[bytes]:
    """The part's bytes as they are read (werkzeug spools a part past 500 KB to a temporary file),
    a piece at a time: a worker holds one piece of an upload, never the whole."""
    size = 0
    while True:
        try:
            piece = file.stream.read(CHUNK_BYTES)
        except RequestEntityTooLarge:  # a body sent without Content-Length, cut at the bound
            raise too_large(max_file_bytes) from None
        size += len(piece)
        if size > max_file_bytes:
            raise too_large(max_file_bytes)
        if not piece:
            return
        yield piece


def listing(store: Store, owner: str, query: FileList) -> dict:
    found = store.files(owner, purpose=query.purpose, after=query.after, limit=query.limit + 1, order=query.order)
    return page(found, query.limit)


def record(store: Store, owner: str, file_id: str) -> FileRecord:
    found = store.file(owner, file_id)
    if found is None:
        raise NotFound(f"No such File object: {file_id}")
    return found


def content(store: Store, owner: str, file_id: str) -> Response:
    """The file's bytes as they were uploaded or written (an output file: JSONL), as OpenAI sends them."""
    found = record(store, owner, file_id)
    pieces = store.content(owner, file_id)
    if pieces is None:  # deleted just now
        raise NotFound(f"No such File object: {file_id}")
    # sent as it is read; its length up front, so that a client sees a file deleted mid-read as cut
    return Response(pieces, mimetype="application/octet-stream", headers={"Content-Length": str(found.bytes)})


def delete(store: Store, owner: str, file_id: str) -> dict:
    if not store.delete_file(owner, file_id):
        raise NotFound(f"No such File object: {file_id}")
    return {"id": file_id, "object": "file", "deleted": True}
