"""`/v1/batches`, served: a new batch over an uploaded file (`validating` until the runner,
service/jobs/, reads it), one batch, its cancellation, and the listing as OpenAI's cursor page.
A batch runs on the engine of the base URL it was created under: `/v1` vLLM, `/static/v1` static."""

from __future__ import annotations

from service.errors import InvalidRequest
from service.jobs.store import BatchRecord, Store
from service.openai.batches.protocol import BatchCreate, BatchList
from service.openai.storage import NotFound, page


def create(store: Store, owner: str, engine: str, req: BatchCreate) -> dict:
    """The batch, once its input file is this key's and was uploaded for the Batch API."""
    source = store.file(owner, req.input_file_id)
    if source is None:
        raise NotFound(f"No such File object: {req.input_file_id}", param="input_file_id")
    if source.purpose != "batch":
        message = f"'input_file_id': the file's purpose is '{source.purpose}', a batch reads one of purpose 'batch'"
        raise InvalidRequest(message, param="input_file_id")
    made = store.add_batch(owner, engine, req.endpoint, req.input_file_id, req.completion_window, req.metadata)
    return made.to_openai()


def record(store: Store, owner: str, batch_id: str) -> BatchRecord:
    found = store.batch(owner, batch_id)
    if found is None:
        raise NotFound(f"No such Batch object: {batch_id}")
    return found


def cancel(store: Store, owner: str, batch_id: str) -> dict:
    """`cancelling` until the runner stops its lines and writes what they made; a batch that has
    already ended stays as it is."""
    found = store.cancel(owner, batch_id)
    if found is None:
        raise NotFound(f"No such Batch object: {batch_id}")
    return found.to_openai()


def listing(store: Store, owner: str, query: BatchList) -> dict:
    return page(store.batches(owner, after=query.after, limit=query.limit + 1), query.limit)
