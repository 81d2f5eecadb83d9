"""`/v1/files`: the upload's form fields (the file itself is read by serving, bounded by
MAX_FILE_BYTES) and the listing's query, as the `openai` SDK sends them. Both are text, read as
their fields' types (`limit=5` is 5); a name they do not declare is refused, named."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_LISTED = 10_000  # OpenAI's bound and default for a page of files


class Upload(BaseModel):
    """`POST /files`' text fields: files are kept for the Batch API alone."""

    model_config = ConfigDict(extra="forbid")
    purpose: Literal["batch"] = Field(description="'batch': a JSONL file of requests for POST /batches")


class FileList(BaseModel):
    """`GET /files`."""

    model_config = ConfigDict(extra="forbid")
    purpose: str | None = Field(None, description="only the files of this purpose")
    after: str | None = Field(None, description="a file id: the files past it, in this order")
    limit: int = Field(MAX_LISTED, ge=1, le=MAX_LISTED)
    order: Literal["asc", "desc"] = Field("desc", description="by creation time")
