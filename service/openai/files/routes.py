"""`/files` under each base URL (service/openai/router.py adds them): storage, so they answer
whatever the engine's state and outside the in-flight cap on generate requests."""

from __future__ import annotations

from flask import jsonify, request

from service.http import lookup
from service.openai import storage
from service.openai.files import serving
from service.openai.files.protocol import FileList, Upload
from service.protocol import validate


def create_file(engine: str):
    config = lookup.config()
    # MAX_CONTENT_LENGTH bounds the JSON bodies; an upload's bound is MAX_FILE_BYTES, set before
    # the body is read
    request.max_content_length = config.max_upload_bytes
    fields, file = serving.read_form(request, config.max_file_bytes)
    form = validate(Upload, fields, config)
    store, owner = storage.caller()
    return jsonify(serving.upload(store, owner, form, file, config.max_file_bytes))


def list_files(engine: str):
    query = validate(FileList, request.args.to_dict(), lookup.config())
    return jsonify(serving.listing(*storage.caller(), query))


def retrieve_file(engine: str, file_id: str):
    found = serving.record(*storage.caller(), file_id)
    return jsonify(found.to_openai())


def file_content(engine: str, file_id: str):
    return serving.content(*storage.caller(), file_id)


def delete_file(engine: str, file_id: str):
    return jsonify(serving.delete(*storage.caller(), file_id))


ROUTES = [
    ("POST", "/files", create_file),
    ("GET", "/files", list_files),
    ("GET", "/files/<file_id>", retrieve_file),
    ("GET", "/files/<file_id>/content", file_content),
    ("DELETE", "/files/<file_id>", delete_file),
]
