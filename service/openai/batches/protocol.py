"""`/v1/batches`: the body of a new batch, every field checked (the body is small: a field it
does not declare is refused, named), and the listing's query."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from service.errors import InvalidRequest
from service.protocol.sampling import Strict

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")  # what a line may call
# OpenAI's bounds on metadata: 16 pairs, keys of 64 characters, values of 512
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)]
MAX_LISTED = 100  # OpenAI's bound on a page of batches


class BatchCreate(Strict):
    """`POST /batches`: a batch over an uploaded file of purpose 'batch', run on the engine of the
    base URL it is created under."""

    model_config = ConfigDict(extra="forbid")
    input_file_id: str = Field(description="a file uploaded with purpose 'batch'")
    endpoint: Literal[ENDPOINTS] = Field(description="what every line of the file calls")
    completion_window: Literal["24h"] = Field(description="past it, the batch ends 'expired'")
    metadata: Metadata | None = None

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, body: Any) -> Any:
        """OpenAI's field that is not implemented here: refused, saying why."""
        if isinstance(body, dict) and body.get("output_expires_after") is not None:
            message = "'output_expires_after' is not supported here: output files are kept until deleted"
            raise InvalidRequest(message, param="output_expires_after")
        if isinstance(body, dict) and "output_expires_after" in body:
            return {key: value for key, value in body.items() if key != "output_expires_after"}
        return body


class BatchList(BaseModel):
    """`GET /batches`, newest first: its query, text read as the fields' types."""

    model_config = ConfigDict(extra="forbid")
    after: str | None = Field(None, description="a batch id: the batches made before it")
    limit: int = Field(20, ge=1, le=MAX_LISTED)
